"""NYC TLC yellow-taxi trips: the canonical schema and its source variants (`schema`), an offline
TLC-shaped generator (`synthetic`), and the pure PySpark transforms (`transforms`).

`schema` and `synthetic` need only pyarrow; import `transforms` where PySpark is wanted.
"""
