"""The benchmark suites (load, queries, concurrency) and their shared parts (measurement header, result writer, charts)."""
