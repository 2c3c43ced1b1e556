"""SQL pipelines: a .sql file whose statements carry `-- id / -- depends_on / -- node` headers, run as a DAG on the
worker plane, with table and column lineage kept in the lake.

- `sqlfile`: the file -> statements with their headers (split by sqlglot's tokenizer, line numbers kept)
- `tables`: the tables a statement reads and writes (sqlglot, through joins, CTEs and subqueries)
- `dag`: nodes, declared and inferred edges, pins, cycles, `--select` (graphlib)
- `runner`: the run on the workers (every ready node submitted at once; failures skip descendants)
- `lineage`: table and column lineage of a statement (sqlglot.lineage)
- `history`: runs, nodes and lineage in the lake (`pipeline_runs`, `pipeline_nodes`, `lineage_tables`, `lineage_columns`)
- `environments`: `--env dev` (tables in `dev__<schema>`, prod read where dev has none, prod never written), `diff`
- `promote`: prod serves an environment's tables (views over its renamed tables, one snapshot, no data copied)
- `flow`: `plan`, `run` and `lineage` end to end; `draw`: a DAG to a PNG
"""
