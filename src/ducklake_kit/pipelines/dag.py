"""A pipeline file -> its DAG: nodes, declared and inferred edges, where each node runs, and the checks that make a
bad file one clear line (unknown or duplicate id, a dependency on an unknown id, a cycle, worker-local tables
used where they cannot be).

Inference reads the file in order, as a script would run: a statement that uses a table (or a schema) depends on
the last earlier statement that wrote it, and a statement that writes it also on those that read the version it
replaces; a table used before any statement of the file made it waits for the one that makes it later. An inferred
edge the headers do not imply (directly or through other nodes) is added and reported (`--strict` makes it an
error), so a header cannot leave out a table sqlglot can see; a statement sqlglot does not know is reported too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from ducklake_kit.errors import first_line
from ducklake_kit.pipelines.audits import Audit, AuditError
from ducklake_kit.pipelines.audits import parse as parse_audits
from ducklake_kit.pipelines.incremental import Kind, KindError
from ducklake_kit.pipelines.incremental import parse as parse_kind
from ducklake_kit.pipelines.sqlfile import PipelineError, Statement, read_file, split_statements
from ducklake_kit.pipelines.tables import CHANGE, DIALECT, DROP, MAKE, READ, TableRef, TableUse, table_use


def generations(graph: dict[str, set[str]], order: list[str]) -> list[list[str]]:
    """The nodes of `graph` (node -> its parents) by depth, each generation in `order`: the first depends on nothing,
    each next one only on those before it."""
    sorter = TopologicalSorter(graph)
    sorter.prepare()
    out = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=order.index)
        out.append(ready)
        sorter.done(*ready)
    return out


@dataclass
class Node:
    id: str
    sql: str
    line: int
    position: int
    use: TableUse
    description: str | None = None
    pin: str | None = None  # the worker it must run on
    pin_reason: str | None = None  # "-- node" or why it was inherited (the worker-local table it reads)
    pin_line: int | None = None  # the line of its `-- node:` header
    depends_line: int | None = None  # the line of its `-- depends_on:` header
    audits: list[Audit] = field(default_factory=list)  # its `-- audit:` checks, of `audited`
    audited: TableRef | None = None  # the table its audits check: the one table it makes or changes
    kind: Kind | None = None  # `-- kind:` incremental_by_time / incremental_by_key; None: a full node
    key: tuple[str, ...] = ()  # `-- key:` the columns that name a row of the table it writes (`pipeline diff`)

    @property
    def audit_reads(self) -> set[TableRef]:
        """The tables its `sql_file` audits read besides the ones it writes: the node waits for them (an inferred
        edge) and they are inputs of its fingerprint, but not of its lineage (its table is not built from them)."""
        return {t for a in self.audits for t in a.reads} - self.use.writes

    def uses(self) -> dict[TableRef, set[str]]:
        """What it does to each table, its audits' reads included (what inference reads)."""
        out = {t: set(roles) for t, roles in self.use.uses.items()}
        for t in self.audit_reads:
            out.setdefault(t, set()).add(READ)
        return out

    @property
    def writes_lake(self) -> bool:
        return any(not t.local for t in self.use.writes)

    @property
    def commits(self) -> bool:
        """Runs as one transaction with a commit message: a statement that may change the lake (a table, a schema,
        a view), not a query, not a write to a worker-local table, not one sqlglot does not know (a CALL of a
        DuckLake function may not run inside a transaction)."""
        tree = self.use.tree
        if tree is None or self.use.opaque or isinstance(tree, (exp.Query, exp.Describe)):
            return False
        return not any(t.local for t in self.use.writes)


@dataclass(frozen=True)
class Edge:
    parent: str
    child: str
    declared: bool
    inferred: bool
    why: str  # for inferred edges: the tables that make the child depend on the parent

    @property
    def kind(self) -> str:
        return "declared+inferred" if self.declared and self.inferred else ("declared" if self.declared else "inferred")


@dataclass
class Pipeline:
    name: str
    file: str
    nodes: dict[str, Node]  # in file order
    edges: list[Edge]
    warnings: list[str] = field(default_factory=list)
    env: str | None = None  # the environment it runs in (its tables in `<env>__<schema>`); None: prod

    def parents(self, node: str) -> set[str]:
        return {e.parent for e in self.edges if e.child == node}

    def children(self, node: str) -> set[str]:
        return {e.child for e in self.edges if e.parent == node}

    def graph(self, only: set[str] | None = None) -> dict[str, set[str]]:
        """node -> its parents (graphlib's shape), restricted to `only` when given."""
        keep = set(self.nodes) if only is None else only
        return {n: self.parents(n) & keep for n in self.nodes if n in keep}

    def waves(self, only: set[str] | None = None) -> list[list[str]]:
        """The nodes by depth: a wave's nodes depend only on earlier waves (the order the run may take, at most)."""
        return generations(self.graph(only), list(self.nodes))

    def ancestors(self, node: str) -> set[str]:
        return _reach(node, self.parents)

    def descendants(self, node: str) -> set[str]:
        return _reach(node, self.children)

    def select(self, selector: str) -> set[str]:
        """dbt's forms, separated by spaces or commas: `name`, `+name` (with its ancestors), `name+` (with its
        descendants), `+name+`."""
        chosen: set[str] = set()
        for term in selector.replace(",", " ").split():
            up, down = term.startswith("+"), term.endswith("+") and len(term) > 1
            name = term.strip("+")
            if name not in self.nodes:
                raise PipelineError(
                    self.file,
                    None,
                    f"--select names '{name}', which is no node of the pipeline",
                    f"use one of {', '.join(self.nodes)} (`pipeline plan` lists them)",
                )
            chosen.add(name)
            if up:
                chosen |= self.ancestors(name)
            if down:
                chosen |= self.descendants(name)
        if not chosen:
            raise PipelineError(self.file, None, "--select is empty", "give node ids, e.g. --select +daily_revenue")
        return chosen

    def check_pins(self, running: list[str]) -> None:
        """Every pinned node names a running worker."""
        for node in self.nodes.values():
            if node.pin and node.pin not in running:
                where = node.pin_line if node.pin_reason == "-- node" else node.line
                raise PipelineError(
                    self.file,
                    where,
                    f"node {node.id} must run on worker '{node.pin}', which is not "
                    f"running (running: {', '.join(running) or 'none'})",
                    "run `up --workers N` to start enough workers, or change its `-- node:`",
                )


def _id_of(stmt: Statement, file: str) -> str:
    value = stmt.header("id")
    if value is None:
        return str(stmt.position)
    if not (value.isdigit() or value.isidentifier()):
        raise PipelineError(
            file,
            stmt.headers["id"].line,
            f"id '{value}' is neither a number nor a name",
            "use letters, digits and _ (e.g. daily_revenue, or 3)",
        )
    return value


def _nodes(statements: list[Statement], file: str) -> dict[str, Node]:
    nodes: dict[str, Node] = {}
    for stmt in statements:
        node_id = _id_of(stmt, file)
        if node_id in nodes:
            first = nodes[node_id]
            line = stmt.headers["id"].line if "id" in stmt.headers else stmt.line
            raise PipelineError(
                file,
                line,
                f"id '{node_id}' is used twice (first on line {first.line})",
                "give every statement its own id (a statement without `-- id:` gets its position)",
            )
        use = table_use(stmt.sql)
        if use.refused:
            raise PipelineError(
                file,
                stmt.line,
                f"statement {node_id} cannot be a pipeline node: {use.refused}",
                "remove it, or do its work inside the statements that need it",
            )
        refused = duckdb_refuses(stmt.sql)
        if refused:
            raise PipelineError(
                file,
                stmt.line,
                f"DuckDB cannot parse statement {node_id} ({refused})",
                "write it as DuckDB SQL (the workers run it with DuckDB, which would refuse it at run time)",
            )
        pin = stmt.header("node")
        audits, audited = _audits(stmt, node_id, use, file)
        nodes[node_id] = Node(
            node_id,
            stmt.sql,
            stmt.line,
            stmt.position,
            use,
            stmt.header("description"),
            pin or None,
            "-- node" if pin else None,
            stmt.headers["node"].line if pin else None,
            stmt.headers["depends_on"].line if "depends_on" in stmt.headers else None,
            audits,
            audited,
            _kind(stmt, node_id, use, file),
            _key(stmt, node_id, use, file),
        )
    return nodes


def _key(stmt: Statement, node_id: str, use: TableUse, file: str) -> tuple[str, ...]:
    """The columns of its `-- key:` header (a list of column names, parsed by sqlglot) of the one table it writes."""
    header = stmt.headers.get("key")
    if header is None:
        return ()
    try:
        tree = sqlglot.parse_one(f"SELECT {header.value}", read=DIALECT)
    except ParseError:
        tree = None
    columns = tree.expressions if isinstance(tree, exp.Select) else []
    if not columns or not all(isinstance(c, exp.Column) and not c.table for c in columns):
        raise PipelineError(
            file, header.line, f"-- key: '{header.value}' is no list of column names", "write -- key: a, b"
        )
    if len(_targets(use)) != 1:
        raise PipelineError(
            file,
            header.line,
            f"node {node_id} has a key but writes {len(_targets(use))} tables; a key names the rows of the one table "
            "its node makes or changes",
            "put -- key: above the statement that builds the table",
        )
    return tuple(c.name for c in columns)


def _targets(use: TableUse) -> list[TableRef]:
    """The tables a statement makes or changes (not a schema, not one it drops)."""
    return sorted(
        t for t, roles in use.uses.items() if not t.is_schema and roles & {MAKE, CHANGE} and DROP not in roles
    )


def _kind(stmt: Statement, node_id: str, use: TableUse, file: str) -> Kind | None:
    header = stmt.headers.get("kind")
    if header is None:
        return None
    try:
        return parse_kind(header.value, node_id, use)
    except KindError as exc:
        raise PipelineError(file, header.line, exc.what, exc.fix) from None


def _audits(stmt: Statement, node_id: str, use: TableUse, file: str) -> tuple[list[Audit], TableRef | None]:
    """The node's audits and the table they check: the one table it makes or changes (not a schema, not one it
    drops)."""
    if not stmt.audits:
        return [], None
    out: list[Audit] = []
    for header in stmt.audits:
        try:
            out += parse_audits(header.value, Path(file).parent)
        except AuditError as exc:
            raise PipelineError(file, header.line, f"node {node_id}: {exc.what}", exc.fix) from None
    targets = _targets(use)
    if len(targets) != 1:
        raise PipelineError(
            file,
            stmt.audits[0].line,
            f"node {node_id} has audits but writes {len(targets)} tables ({', '.join(map(str, targets)) or 'none'}); "
            "an audit checks the one table its node makes or changes",
            "put the audit above the statement that builds the table",
        )
    return out, targets[0]


def duckdb_refuses(sql: str) -> str | None:
    """DuckDB's own parser's word on a statement (nothing is run): its first line when it cannot parse it. sqlglot
    accepts some text DuckDB does not (and the other way round): plan must fail where run would."""
    try:
        duckdb.extract_statements(sql)
    except duckdb.ParserException as exc:
        return first_line(exc)
    return None


def _declared(statements: list[Statement], nodes: dict[str, Node], file: str) -> dict[tuple[str, str], str]:
    edges: dict[tuple[str, str], str] = {}
    for stmt, node in zip(statements, nodes.values()):
        header = stmt.headers.get("depends_on")
        if header is None:
            continue
        for dep in (d.strip() for d in header.value.split(",")):
            if not dep:
                continue
            if dep not in nodes:
                raise PipelineError(
                    file,
                    header.line,
                    f"node {node.id} depends on '{dep}', which is no id of this file",
                    f"use one of {', '.join(nodes)}",
                )
            if dep == node.id:
                raise PipelineError(file, header.line, f"node {node.id} depends on itself", "remove it from depends_on")
            edges[(dep, node.id)] = ""
    return edges


_VERB = {MAKE: "made", CHANGE: "changed", DROP: "dropped"}


def _write_role(roles: set[str]) -> str | None:
    for role in (DROP, MAKE, CHANGE):
        if role in roles:
            return role
    return None


def _reach(start: str, step: Callable[[str], Iterable[str]]) -> set[str]:
    """Every node `step` leads to from `start`, repeatedly (its ancestors, or its descendants)."""
    seen, todo = set(), [start]
    while todo:
        for n in step(todo.pop()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def _declared_ancestors(node: str, declared: dict[tuple[str, str], str]) -> set[str]:
    """What the headers already make `node` wait for, directly or through other nodes."""
    return _reach(node, lambda child: (parent for parent, c in declared if c == child))


def _inferred(nodes: dict[str, Node]) -> dict[tuple[str, str], set[str]]:
    """Edges from what the statements do to each table (and schema), read in file order as a script runs: a
    statement that uses a table depends on the last earlier statement that wrote it (made, changed or dropped it),
    and one that writes it also on the statements that read the version it replaces. A table no earlier statement
    wrote is the lake's own, unless a later statement makes it (CREATE): then its users wait for that one."""
    order = list(nodes.values())
    users: dict[TableRef, list[tuple[int, str, set[str]]]] = {}
    for i, node in enumerate(order):
        for t, roles in node.uses().items():
            users.setdefault(t, []).append((i, node.id, roles))
    edges: dict[tuple[str, str], set[str]] = {}

    def add(parent: str, child: str, why: str) -> None:
        if parent != child:
            edges.setdefault((parent, child), set()).add(why)

    for t, uses in users.items():
        last: tuple[str, str] | None = None  # (node, role) of the last write so far
        readers: list[str] = []  # who read the version `last` made (or the lake's own)
        for k, (_i, node, roles) in enumerate(uses):
            write = _write_role(roles)
            if last is None and write not in (MAKE, DROP):  # (DROP ... IF EXISTS first acts on the lake's own)
                maker = next((n for _j, n, r in uses[k + 1 :] if MAKE in r), None)
                if maker is not None:  # the table does not exist before that statement makes it
                    add(maker, node, f"{t} (made by {maker}, later in the file)")
                    continue
            if last is not None:
                add(last[0], node, f"{t} ({_VERB[last[1]]} by {last[0]})")
            if write is None:
                readers.append(node)
                continue
            for reader in readers:
                add(reader, node, f"{t} (read by {reader} before this {_VERB[write]} it)")
            last, readers = (node, write), []
    return edges


def _place_local(nodes: dict[str, Node], order: list[str], file: str) -> None:
    """Worker-local tables live on one worker: their writers must be pinned, and their readers run there too.
    `order`: the nodes in an order the DAG allows (makers before readers)."""
    made_on: dict[TableRef, tuple[str, str]] = {}
    for node in (nodes[n] for n in order):
        local_writes = sorted(t for t in node.use.writes if t.local)
        if local_writes and node.writes_lake:
            raise PipelineError(
                file,
                node.line,
                f"node {node.id} writes both the lake and the worker-local "
                f"{local_writes[0]}; one transaction can write only one database",
                "split it into two statements",
            )
        for t in sorted(t for t in node.use.reads if t.local and t not in node.use.writes):
            if t not in made_on:
                if not node.pin:
                    raise PipelineError(
                        file,
                        node.line,
                        f"node {node.id} reads the worker-local table {t}, which no earlier node of this file makes",
                        "pin it to the worker that holds the table with `-- node: wN`",
                    )
                continue
            worker, maker = made_on[t]
            if node.pin and node.pin != worker:
                raise PipelineError(
                    file,
                    node.line,
                    f"node {node.id} runs on {node.pin} but reads the worker-local "
                    f"table {t}, which node {maker} makes on {worker}",
                    f"pin both to one worker (`-- node: {worker}`)",
                )
            if not node.pin:
                node.pin, node.pin_reason = worker, f"reads {t}, made on {worker} by node {maker}"
        for t in local_writes:
            if not node.pin:
                raise PipelineError(
                    file,
                    node.line,
                    f"node {node.id} writes the worker-local table {t} but names no "
                    "worker, so later nodes could not find it",
                    "add `-- node: w1` above it",
                )
            made_on[t] = (node.pin, node.id)


def build(source: str, file: str = "<sql>", *, name: str | None = None, strict: bool = False) -> Pipeline:
    statements = split_statements(source, file)
    if not statements:
        raise PipelineError(file, None, "the file has no SQL statement", "write at least one statement")
    nodes = _nodes(statements, file)
    declared = _declared(statements, nodes, file)
    inferred = _inferred(nodes)
    edges, warnings = [], []
    for parent, child in sorted(
        set(declared) | set(inferred), key=lambda e: (nodes[e[1]].position, nodes[e[0]].position)
    ):
        why = "; ".join(sorted(inferred.get((parent, child), ())))
        edge = Edge(parent, child, (parent, child) in declared, (parent, child) in inferred, why)
        edges.append(edge)
        if not edge.declared and parent not in _declared_ancestors(child, declared):  # not implied by the headers
            msg = (
                f"{file}:{nodes[child].line}: node {child} uses {why}, but does not declare "
                f"depends_on: {parent}; the edge was added"
            )
            if strict:
                raise PipelineError(
                    file,
                    nodes[child].line,
                    f"node {child} depends on {parent} ({why}) without declaring it (--strict)",
                    f"add `-- depends_on: {parent}`",
                )
            warnings.append(msg)
    for node in nodes.values():
        if node.use.opaque:
            warnings.append(
                f"{file}:{node.line}: node {node.id}: {node.use.opaque}, so its tables are not inferred; "
                "declare its dependencies with -- depends_on"
            )
    pipeline = Pipeline(name or Path(file).stem, file, nodes, edges, warnings)
    try:
        TopologicalSorter(pipeline.graph()).prepare()
    except CycleError as exc:
        cycle = list(exc.args[1])  # [a, b, ..., a]: graphlib lists each as a dependency (predecessor) of the next
        path = " -> ".join(cycle)
        first = nodes[cycle[0]]
        raise PipelineError(
            file,
            first.depends_line or first.line,
            f"the dependencies form a cycle: {path}",
            "remove one of these depends_on (or the use of a table an inferred one comes from)",
        ) from None
    _place_local(nodes, [n for wave in pipeline.waves() for n in wave], file)
    return pipeline


def load(path: Path, *, strict: bool = False) -> Pipeline:
    source, shown = read_file(path)
    return build(source, shown, name=path.stem, strict=strict)
