"""The step runner: NoETL-style `tool: ducklake` playbooks (YAML) run on the worker plane.

schema (YAML with lines, JSON Schema) -> noetl (v1/v2 -> the kit's model) -> runner (routes, loops, templates)
-> task (what a worker runs) -> results (the seed's result shape)."""
