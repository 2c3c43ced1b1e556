"""Change-aware runs: which nodes must run, and why, from their fingerprints.

A node's fingerprint is its SQL, normalised (sqlglot's AST with every table named in full, identifiers folded, and
written back without comments or layout, so whitespace, comments and the case of keywords do not count), plus the
version of every table it reads: the last snapshot that changed that table's data or schema, as the catalog says
(`versions`). A node is skipped (`unchanged`) when its fingerprint equals the one of its last run that succeeded,
its last run did not fail, and the tables it writes are as it left them. Otherwise it runs, with the reason.

Ideas from sqlmesh (a fingerprint of the query and its parents; a change is breaking or not) and dbt
(`state:modified+`): a node whose SQL changed is categorised by what it does to its columns. A change of only the
projections (a column added, removed or computed differently) touches those columns; anything else (FROM, WHERE,
GROUP BY, a CTE...) touches every column. A change that only adds columns is non-breaking. A node downstream reads
the new table only when it reads one of the touched columns (the lineage module says which columns it reads);
otherwise it stays skipped, since its answer cannot differ.

Two kinds of table are never trusted to the catalog: a worker-local table (it lives in one worker's memory; the
nodes that make, read and drop one run together or not at all, decided before the run from the plan), and a lake
table that more than one node of the file writes (its nodes always run: skipping one writer of a table another
rebuilds would leave the table half-made).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import quote_ident
from ducklake_kit.pipelines.dag import Node, Pipeline
from ducklake_kit.pipelines.lineage import Schema, columns_read, qualified_tables
from ducklake_kit.pipelines.tables import DIALECT, MAKE, TableRef, table_use

ABSENT = "absent"  # the version of a table the lake does not have
EVERY = "*"  # a change touches every column / a node reads every column
AUDITS = "(audits)"  # among a node's inputs: the hash of its audits, so that a new or edited audit runs it again


def normalised(tree: exp.Expression) -> str:
    """The statement as one canonical text: tables in full, unquoted identifiers folded to lower case, keywords
    upper case, no comments, no layout."""
    tree = normalize_identifiers(qualified_tables(tree), dialect=DIALECT)
    return tree.sql(dialect=DIALECT, comments=False)


def sql_hash(node_or_sql: Node | str) -> str:
    """The hash of a node's normalised SQL (of its text when sqlglot cannot parse it)."""
    sql = node_or_sql.sql if isinstance(node_or_sql, Node) else node_or_sql
    tree = node_or_sql.use.tree if isinstance(node_or_sql, Node) else table_use(sql).tree
    text = normalised(tree) if tree is not None else sql
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def versions(lake: Lake) -> dict[str, str]:
    """Every lake table (and schema) -> the last snapshot that changed it: its creation (a CREATE OR REPLACE makes a
    new table), or a later snapshot whose changes name its id (rows inserted or deleted, inlined or in files, its
    columns altered, its files compacted); a view's, the snapshot that made it (a promote re-points prod's views).
    Keys are `str(TableRef)`."""
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    rows = lake.con.execute(
        f"""
        WITH cur AS (
            SELECT t.table_id, s.schema_name, t.table_name, t.begin_snapshot
            FROM {meta}.ducklake_table t JOIN {meta}.ducklake_schema s ON s.schema_id = t.schema_id
            WHERE t.end_snapshot IS NULL AND s.end_snapshot IS NULL),
        ch AS (SELECT snapshot_id, unnest(map_keys(changes)) AS kind, unnest(map_values(changes)) AS ids
               FROM ducklake_snapshots(?)),
        ids AS (SELECT snapshot_id, unnest(ids) AS id FROM ch WHERE NOT ends_with(kind, '_created'))
        SELECT cur.schema_name, cur.table_name, greatest(cur.begin_snapshot, max(ids.snapshot_id))
        FROM cur LEFT JOIN ids ON ids.id = CAST(cur.table_id AS VARCHAR)
        GROUP BY cur.schema_name, cur.table_name, cur.begin_snapshot
        UNION ALL
        SELECT s.schema_name, v.view_name, v.begin_snapshot
        FROM {meta}.ducklake_view v JOIN {meta}.ducklake_schema s ON s.schema_id = v.schema_id
        WHERE v.end_snapshot IS NULL AND s.end_snapshot IS NULL
        UNION ALL
        SELECT schema_name, '', begin_snapshot FROM {meta}.ducklake_schema WHERE end_snapshot IS NULL""",
        [lake.alias],
    ).fetchall()
    return {str(TableRef("lake", s.lower(), t.lower())): str(v) for s, t, v in rows}


@dataclass(frozen=True)
class ColumnChange:
    """What a node's SQL change does to the table it builds."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    every: bool = False  # not a change of projections only: every column may differ
    why: str = ""  # for `every`: what else changed

    @property
    def breaking(self) -> bool:
        return self.every or bool(self.removed or self.modified)

    @property
    def columns(self) -> set[str]:
        return {c.lower() for c in (*self.added, *self.removed, *self.modified)}

    def describe(self) -> str:
        kind = "breaking" if self.breaking else "non-breaking"
        if self.every:
            return f"{kind}: {self.why}, so every column may change"
        parts = [
            f"{w} {', '.join(cs)}"
            for w, cs in (("adds", self.added), ("removes", self.removed), ("changes", self.modified))
            if cs
        ]
        return f"{kind}: {'; '.join(parts) or 'the same columns'}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "breaking": self.breaking,
            "added": list(self.added),
            "removed": list(self.removed),
            "modified": list(self.modified),
            "every_column": self.every,
            "text": self.describe(),
        }


def _everything(why: str) -> ColumnChange:
    return ColumnChange(every=True, why=why)


def column_change(old_sql: str, new: Node) -> ColumnChange:
    """Compare a node's SQL with what it was: the columns its change touches (see the module's text)."""
    old = table_use(old_sql).tree
    tree = new.use.tree
    if old is None or tree is None:
        return _everything("sqlglot cannot read one of the two versions")
    if not (isinstance(old, exp.Create) and isinstance(tree, exp.Create)):
        return _everything("it is not a CREATE ... AS SELECT")
    oq, nq = old.expression, tree.expression
    if not (isinstance(oq, exp.Select) and isinstance(nq, exp.Select)):
        return _everything("its query is not one SELECT")
    if _without_projections(old) != _without_projections(tree):
        return _everything("more than its SELECT list changed")
    before, after = _projections(oq), _projections(nq)
    if before is None or after is None:
        return _everything("its SELECT list has a * or a name twice")
    added = tuple(c for c in after if c not in before)
    removed = tuple(c for c in before if c not in after)
    modified = tuple(c for c in after if c in before and before[c] != after[c])
    common_before = [c for c in before if c in after]
    common_after = [c for c in after if c in before]
    if common_before != common_after:
        return _everything("its columns were reordered")
    touched = [*added, *removed, *modified]
    if touched and nq.args.get("distinct") is not None:
        return _everything("its rows are DISTINCT over its SELECT list")
    group = nq.args.get("group")
    if group is not None and (group.args.get("all") or any(isinstance(g, exp.Literal) for g in group.expressions)):
        keys = [c for c in touched if not (_aggregates(oq, c) and _aggregates(nq, c))]
        if keys:  # a grouping key of GROUP BY ALL or by position changed: so did the groups
            return _everything(f"it groups by its SELECT list and {keys[0]} is a grouping key")
    return ColumnChange(added, removed, modified)


def _aggregates(query: exp.Select, column: str) -> bool:
    """The projection named `column` (absent counts as one) computes an aggregate, so it is no grouping key."""
    p = next((p for p in query.expressions if p.alias_or_name.lower() == column), None)
    return p is None or p.find(exp.AggFunc) is not None


def _without_projections(tree: exp.Create) -> str:
    copy = tree.copy()
    copy.expression.set("expressions", [])
    return normalised(copy)


def _projections(query: exp.Select) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for p in query.expressions:
        name = p.alias_or_name.lower()
        if isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star)) or name in out:
            return None
        out[name] = normalised(p.unalias() if isinstance(p, exp.Alias) else p)
    return out


@dataclass(frozen=True)  # shared by the deciders of one plan or run (flow._decider): read only
class Previous:
    """A node's last decided run, as the history recorded it."""

    run_id: str
    status: str  # ok, unchanged, failed, skipped
    sql: str
    sql_hash: str | None
    inputs: dict[str, str] | None
    outputs: dict[str, str] | None
    error: str | None = None
    last_ok: str | None = None  # the last run that ran it and succeeded
    fingerprint: str | None = None


@dataclass
class Decision:
    node: str
    run: bool
    reason: str
    sql_hash: str
    inputs: dict[str, str] = field(default_factory=dict)  # what it reads -> the version it read (or would read)
    change: ColumnChange | None = None  # its SQL change, when its SQL changed
    only_sql: bool = False  # it runs only because its SQL changed: what it does to its table is `change`

    @property
    def fingerprint(self) -> str:
        text = json.dumps([self.sql_hash, sorted(self.inputs.items())])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "reason": self.reason,
            "fingerprint": self.fingerprint,
            "inputs": self.inputs,
            "change": self.change.as_dict() if self.change else None,
        }


def outputs_of(node: Node) -> list[TableRef]:
    """The lake tables a node writes and the schemas it makes: what it must find as it left them to be skipped."""
    made = {t for t, roles in node.use.uses.items() if t.is_schema and MAKE in roles}
    return sorted(t for t in node.use.writes | made if not t.local)


def local_only(node: Node) -> bool:
    """It writes only worker-local tables: it exists to feed (or tidy up after) the nodes that read them."""
    return bool(node.use.writes) and all(t.local for t in node.use.writes)


def _shared_lake_tables(pipeline: Pipeline) -> dict[str, list[str]]:
    writers: dict[str, list[str]] = {}
    for node in pipeline.nodes.values():
        for t in node.use.writes:
            if not t.local:
                writers.setdefault(str(t), []).append(node.id)
    return {t: ns for t, ns in writers.items() if len(ns) > 1}


class Decider:
    """Decides, node by node in dependency order, whether it runs. `versions()` reads the tables' versions now
    (called again only after a node of this run changed the lake); `schema()` the tables' columns (for the columns
    a node reads, asked only when an input changed by a column-level change). Planning (`plan`) decides every node
    at once, as if each node that would run changed its tables; a run decides each node when it becomes ready."""

    def __init__(
        self,
        pipeline: Pipeline,
        previous: dict[str, Previous],
        versions: Callable[[], dict[str, str]],
        schema: Callable[[], Schema],
    ) -> None:
        self.pipeline, self.previous = pipeline, previous
        self._versions, self._schema = versions, schema
        self._now: dict[str, str] | None = None
        self._schema_cache: Schema | None = None
        self.decided: dict[str, Decision] = {}
        self.wrote: dict[str, tuple[str, str]] = {}  # table -> (node of this run that changed it, version after)
        self.shared = _shared_lake_tables(pipeline)
        self.local_plan: dict[str, Decision] = {}  # planned decisions of local-only nodes (see plan)

    def now(self) -> dict[str, str]:
        if self._now is None:
            self._now = self._versions()
        return self._now

    def ran(self, node_id: str, snapshot: int | None, *, planning: bool = False) -> None:
        """A node of this run ran (the snapshot it committed, if any), or would (planning: each table it writes
        gets a new version)."""
        node = self.pipeline.nodes[node_id]
        lake_writes = [str(t) for t in outputs_of(node)]
        if planning:
            now = self.now()
            for t in lake_writes:
                self.wrote[t] = (node_id, f"after {node_id}")
                now[t] = f"after {node_id}"
            return
        for t in lake_writes:
            self.wrote[t] = (node_id, str(snapshot) if snapshot is not None else "")
        if lake_writes:
            self._now = self._schema_cache = None  # read again before the next decision

    def version(self, t: TableRef) -> str:
        """A lake table's last-change snapshot; a worker-local table's, the fingerprint of the node that makes it
        (decided in this run, else as its last run recorded it: `--select` and `--from-failed` may leave it out)."""
        if t.local:
            maker = next((n for n in self.pipeline.nodes.values() if MAKE in n.use.uses.get(t, set())), None)
            if maker is None:
                return "unknown: no node of the file makes it"
            prev = self.previous.get(maker.id)
            fingerprint = self.decided[maker.id].fingerprint if maker.id in self.decided else prev and prev.fingerprint
            return f"made by {maker.id}: {fingerprint}"
        return self.now().get(str(t), ABSENT)

    def decide(self, node_id: str, *, force: bool = False) -> Decision:
        d = self._decide(node_id, force)
        if not d.run and node_id in self.local_plan and self.local_plan[node_id].run:
            d.run, d.reason = True, self.local_plan[node_id].reason
        self.decided[node_id] = d
        return d

    def _decide(self, node_id: str, force: bool) -> Decision:
        node = self.pipeline.nodes[node_id]
        h = sql_hash(node)
        reads = node.use.reads | node.audit_reads  # an sql_file audit's tables: a change to them may fail it
        inputs = {str(t): self.version(t) for t in sorted(reads) if t not in node.use.writes}
        if node.audits:
            texts = [f"{a.text} {a.query or ''}" for a in node.audits]
            inputs[AUDITS] = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
        d = Decision(node_id, True, "", h, inputs)
        prev = self.previous.get(node_id)
        if force:
            d.reason = "--force"
        elif node.use.tree is None or node.use.opaque:
            d.reason = "always runs: sqlglot cannot read which tables it uses"
        elif not node.use.writes and not node.commits:
            d.reason = "always runs: a query changes nothing"
        elif shared := sorted(t for t in map(str, node.use.writes) if t in self.shared):
            others = [n for n in self.shared[shared[0]] if n != node_id]
            d.reason = f"always runs: {shared[0]} is also written by node {', '.join(others)} of this file"
        elif prev is None:
            d.reason = "new: no earlier run of this node"
        elif prev.status == "failed":
            d.reason = f"its last run ({prev.run_id}) failed"
        elif prev.status not in ("ok", "unchanged"):
            d.reason = f"its last run ({prev.run_id}) did not run it"
        elif prev.sql_hash is None or prev.inputs is None or prev.outputs is None:
            d.reason = "no fingerprint recorded by its last run"
        elif prev.sql_hash != h:
            d.change = column_change(prev.sql, node)
            d.reason = f"SQL changed ({d.change.describe()})"
            d.only_sql = self._inputs_changed(node, d, prev) is None and self._output_changed(node, prev) is None
        elif (why := self._inputs_changed(node, d, prev)) is not None or (
            why := self._output_changed(node, prev)
        ) is not None:
            d.reason = why
        else:
            d.run, d.reason = False, f"unchanged since run {prev.last_ok or prev.run_id}"
        return d

    def _inputs_changed(self, node: Node, d: Decision, prev: Previous) -> str | None:
        assert prev.inputs is not None
        for t, now in d.inputs.items():
            was = prev.inputs.get(t)
            if was == now:
                continue
            if t == AUDITS:
                return "its audits are new or changed"
            if was is None:
                return f"it reads {t} now (a new input)"
            if now == ABSENT:
                return f"its input {t} is missing"
            if self._change_not_read(node, t, was):
                continue
            by = self.wrote.get(t)
            if by is not None and by[1] == now:
                return f"its input {t} was changed by node {by[0]} in this run"
            return f"its input {t} changed (snapshot {was} -> {now})"
        return None

    def _change_not_read(self, node: Node, table: str, was: str) -> bool:
        """The input changed only by a node of this run whose change touched columns this node does not read."""
        by = self.wrote.get(table)
        if by is None or self.now().get(table) != by[1]:
            return False
        parent = self.decided.get(by[0])
        parent_prev = self.previous.get(by[0])
        if parent is None or not parent.only_sql or parent.change is None or parent.change.every:
            return False
        if parent_prev is None or (parent_prev.outputs or {}).get(table) != was:
            return False  # this node had not read the parent's last table either
        reads = columns_read(node.use, self.schema())
        if reads is None:
            return False
        ref = next((t for t in node.use.reads if str(t) == table), None)
        if ref is None:  # read by one of its audits only: the audit's answer may differ
            return False
        read = reads.get(ref, set())
        return EVERY not in read and not (read & parent.change.columns)

    def output_changed(self, node: Node, prev: Previous) -> str | None:
        """Why the tables the node writes are not as its last run left them (None: they are)."""
        return self._output_changed(node, prev)

    def _output_changed(self, node: Node, prev: Previous) -> str | None:
        assert prev.outputs is not None
        for t in outputs_of(node):
            now, was = self.version(t), prev.outputs.get(str(t))
            if was is None or was == now:
                continue
            if now == ABSENT:
                return f"its output {t} is missing"
            return f"its output {t} was changed outside this pipeline since its last run (snapshot {was} -> {now})"
        return None

    def schema(self) -> Schema:
        if self._schema_cache is None:
            self._schema_cache = self._schema()
        return self._schema_cache

    def plan(self, order: list[str], *, force: bool = False) -> dict[str, Decision]:
        """Decide every node of `order` (a dependency order) as a run would if each node that runs changed its
        tables; then the nodes that make, read or drop a worker-local table run together if one of them does."""
        for node_id in order:
            d = self.decide(node_id, force=force)
            if d.run:
                self.ran(node_id, None, planning=True)
        out = dict(self.decided)
        self._together(out)
        self.local_plan = {n: d for n, d in out.items() if local_only(self.pipeline.nodes[n])}
        return out

    def _together(self, decisions: dict[str, Decision]) -> None:
        groups: dict[TableRef, list[str]] = {}
        for n in decisions:
            for t in self.pipeline.nodes[n].use.uses:
                if t.local and not t.is_schema:
                    groups.setdefault(t, []).append(n)
        changed = True
        while changed:  # a local-only node that runs may read another worker-local table: its makers run too
            changed = False
            for t, members in groups.items():
                running = [n for n in members if decisions[n].run]
                if not running:
                    continue
                for n in members:
                    if not decisions[n].run and local_only(self.pipeline.nodes[n]):
                        decisions[n].run = True
                        decisions[
                            n
                        ].reason = (
                            f"node {running[0]} uses {t}, which lives in a worker's memory: its nodes run together"
                        )
                        changed = True


def outputs_after(pipeline: Pipeline, done: list, now: dict[str, str], previous: dict[str, Previous]) -> dict:
    """node -> {table it writes: its version as the node left it}: a node that ran, the snapshot it committed when
    it was the last of this run to change the table (else the version now); an unchanged node, what it recorded."""
    last_writer: dict[str, tuple[str, int | None]] = {}
    for run in done:  # in file order; a table written by several nodes always has all of them run
        if run.status == "ok":
            for t in pipeline.nodes[run.id].use.writes:
                last_writer[str(t)] = (run.id, run.snapshot_id)
    out: dict[str, dict[str, str]] = {}
    for run in done:
        node = pipeline.nodes[run.id]
        if run.status == "unchanged":
            prev = previous.get(run.id)
            out[run.id] = dict(prev.outputs or {}) if prev else {}
            continue
        if run.status != "ok":
            continue
        made = {}
        for t in outputs_of(node):
            writer = last_writer.get(str(t))
            snap = writer[1] if writer and writer[0] == run.id else None
            there = now.get(str(t), ABSENT)  # a table it dropped is absent, whatever snapshot the DROP made
            made[str(t)] = str(snap) if snap is not None and there != ABSENT else there
        out[run.id] = made
    return out
