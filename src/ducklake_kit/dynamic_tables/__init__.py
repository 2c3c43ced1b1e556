"""Dynamic tables: `CREATE DYNAMIC TABLE ... TARGET_LAG ... AS SELECT`, kept fresh from DuckLake's change feed.

`ddl` parses the language, `plan` decides how a query can be refreshed and rewrites it, `metadata` keeps the
definitions and history in PostgreSQL, `refresh` runs one refresh, `manage` the tables' life and batches of
refreshes in dependency order, `scheduler` the `dynamic run` loop."""
