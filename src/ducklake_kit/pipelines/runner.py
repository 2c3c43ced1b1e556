"""Run a pipeline's DAG on the worker plane: graphlib's TopologicalSorter decides what is ready, every ready node is
submitted at once (a pinned one to its worker), and a node's dependents become ready the moment it finishes (no
barrier per wave).

Among queued nodes a free worker takes the one with the longest chain of dependents first (`critical_rank`).
dbt's failure semantics: a failed node's descendants are skipped with the reason, independent nodes go on. A node
that writes lake tables runs as one transaction whose commit message names the pipeline, the node and the run, so
each such node is one snapshot (or nothing). A node is never submitted twice (see workers.tasks.claim_once).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from graphlib import TopologicalSorter
from typing import Any

from ducklake_kit.errors import first_line
from ducklake_kit.lake.transactions import CommitTag
from ducklake_kit.pipelines.dag import Node, Pipeline
from ducklake_kit.workers.client import WorkerPlane
from ducklake_kit.workers.tasks import StatementOutcome, TaskResult

OK, FAILED, SKIPPED = "ok", "failed", "skipped"
UNCHANGED = "unchanged"  # not run: its fingerprint is what it was at its last successful run (see changes.py)
ROWS_SHOWN = 100  # rows of a node's SELECT kept in its result (row_count says how many there were)
RELEASE_BATCH = 32  # results read, released together (see _release)


def new_run_id() -> str:
    """Sortable by time, unique: 20261123T231500-1a2b3c."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def _when(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


def commit_message(pipeline: str, node: str, run_id: str) -> str:
    return f"pipeline {pipeline}: node {node} (run {run_id})"


@dataclass
class NodeRun:
    id: str
    status: str  # ok, failed, skipped (a dependency failed), unchanged (change-aware: nothing it depends on changed)
    worker: str | None = None
    started_at: datetime | None = None  # on the worker, UTC
    finished_at: datetime | None = None
    error: str | None = None  # DuckDB's own message (with the statement) for a failed node
    reason: str | None = None  # why a node was skipped (or left unchanged)
    why: str | None = None  # why a change-aware run ran it or left it (new, SQL changed, input X changed, ...)
    statements: list[StatementOutcome] = field(default_factory=list)  # what its task reported, statement by statement
    snapshot_id: int | None = None  # the snapshot the node committed
    sql: str = ""
    unknown: bool = False  # failed in a way that leaves open whether it committed (its worker or the plane died)
    # its fingerprint (change-aware runs, see changes.py): the hash of its normalised SQL and the version of each
    # table it reads, and the version of each table it writes as it left them (recorded for ok and unchanged nodes)
    fingerprint: str | None = None
    sql_hash: str | None = None
    inputs: dict[str, str] | None = None
    outputs: dict[str, str] | None = None
    audits: list[dict[str, Any]] = field(default_factory=list)  # each audit: passed, failed or not run (audit_outcomes)
    incremental: dict[str, Any] | None = None  # an incremental node's run: full or incremental, over which changes

    @property
    def duration_ms(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return round((self.finished_at - self.started_at).total_seconds() * 1000, 3)

    def as_dict(self) -> dict[str, Any]:
        iso = lambda t: t.isoformat(timespec="microseconds") if t else None  # noqa: E731
        return {
            "id": self.id,
            "status": self.status,
            "worker": self.worker,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "duration_ms": self.duration_ms,
            "error": self.error,
            "reason": self.reason,
            "why": self.why,
            "fingerprint": self.fingerprint,
            "inputs": self.inputs,
            "snapshot_id": self.snapshot_id,
            "audits": self.audits,
            "incremental": self.incremental,
            "statements": [_statement_dict(st) for st in self.statements],
        }


@dataclass
class PipelineRun:
    run_id: str
    pipeline: str
    file: str
    started_at: datetime
    finished_at: datetime | None = None
    nodes: list[NodeRun] = field(default_factory=list)
    selector: str | None = None  # --select as given, or "from-failed <run>"
    aborted: str | None = None  # why the run stopped before every node was decided (the worker plane failed)

    @property
    def ok(self) -> bool:
        return all(n.status in (OK, UNCHANGED) for n in self.nodes)

    def count(self, status: str) -> int:
        return sum(1 for n in self.nodes if n.status == status)

    @property
    def status(self) -> str:
        return OK if self.ok else FAILED

    def node(self, node_id: str) -> NodeRun:
        return next(n for n in self.nodes if n.id == node_id)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "pipeline": self.pipeline,
            "file": self.file,
            "status": self.status,
            "started_at": self.started_at.isoformat(timespec="microseconds"),
            "finished_at": self.finished_at.isoformat(timespec="microseconds") if self.finished_at else None,
            "ok": self.count(OK),
            "failed": self.count(FAILED),
            "skipped": self.count(SKIPPED),
            "unchanged": self.count(UNCHANGED),
            "selector": self.selector,
            "aborted": self.aborted,
            "nodes": [n.as_dict() for n in self.nodes],
        }


def _statement_dict(s: StatementOutcome) -> dict[str, Any]:
    return {
        "statement": s.statement,
        "statement_type": s.statement_type,
        "columns": s.columns,
        "rows": [list(r) for r in s.rows[:ROWS_SHOWN]],
        "row_count": len(s.rows),
        "affected_rows": s.affected_rows,
        "seconds": s.seconds,
        "snapshot_id": s.snapshot_id,
    }


def _node_run(node: Node, result: TaskResult) -> NodeRun:
    run = NodeRun(
        node.id,
        OK if result.ok else FAILED,
        result.worker,
        _when(result.started_at),
        _when(result.finished_at),
        statements=list(result.statements),
        snapshot_id=result.snapshot_id,
        sql=node.sql,
        unknown=result.lost,
    )
    if result.error is not None:
        run.error = result.error.error + (" (rolled back)" if result.rolled_back else "")
        if result.error.index is not None and result.error.index > 0 and not result.rolled_back:
            run.error += " (its write stays: it ran outside a transaction)"
    run.audits = audit_outcomes(node, result)
    return run


def audit_outcomes(node: Node, result: TaskResult) -> list[dict[str, Any]]:
    """What became of each of the node's audits: passed (its statement ran: 0 offending rows), failed (the statement
    that raised) or not run (the node, or an audit before it, failed first). Each audit is found by its statement's
    text, since the node's own text before the audits may be one statement or several (an incremental node's DELETE
    and INSERT)."""
    failed = _same(result.error.statement) if result.error is not None and result.error.statement else None
    ran = {_same(s.statement) for s in result.statements}
    out = []
    for audit in node.audits:
        row = {"audit": audit.text, "table": str(node.audited), "status": "not run", "error": None}
        text = _same(audit.check(node.audited)) if node.audited is not None else None
        if text is not None and text == failed:
            row |= {"status": "failed", "error": result.error.error}  # type: ignore[union-attr]
        elif text is not None and text in ran:
            row["status"] = "passed"
        out.append(row)
    return out


def _same(statement: str) -> str:
    """A statement's text as DuckDB's parser hands it back (no surrounding blanks, no final semicolon)."""
    return statement.strip().rstrip(";").strip()


def _skip_reason(node: str, parents: set[str], done: dict[str, NodeRun]) -> str | None:
    """Why `node` must not run: the first of its dependencies that failed or was skipped."""
    for parent in sorted(parents):
        if done[parent].status == FAILED:
            return f"not run: its dependency {parent} failed"
        if done[parent].status == SKIPPED:
            root = done[parent].reason or ""
            return f"not run: its dependency {parent} was skipped ({root.removeprefix('not run: ')})"
    return None


def critical_rank(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each node's longest chain of descendants (0 for a node nothing depends on): a free worker takes the queued
    node with the longest chain behind it first, so a long chain is not left waiting behind independent nodes."""
    children: dict[str, set[str]] = {n: set() for n in graph}
    for node, parents in graph.items():
        for p in parents:
            children[p].add(node)
    rank: dict[str, int] = {}
    for node in reversed(list(TopologicalSorter(graph).static_order())):
        rank[node] = max((rank[c] + 1 for c in children[node]), default=0)
    return rank


@dataclass(frozen=True)
class RunChoice:
    """What a run runs and how: the nodes of `only` (default: all), chosen by `selector` (what the run records:
    `--select`'s text, `from-failed <run>`); `timeout_s` per node, enforced on its worker; `among`, the workers
    unpinned nodes may run on (default: any)."""

    only: set[str] | None = None
    selector: str | None = None
    timeout_s: float | None = None
    among: list[str] | None = None
    # change-aware runs: asked when a node becomes ready (its parents done), the reason to leave it unchanged or None
    # to run it
    gate: Callable[[str, dict[str, NodeRun]], str | None] | None = None
    # the statements to run for a node instead of its own (an incremental node's), asked right after its gate
    texts: Callable[[str], list[str] | None] | None = None


EVERY_NODE = RunChoice()


def run(
    pipeline: Pipeline,
    plane: WorkerPlane,
    *,
    choice: RunChoice = EVERY_NODE,
    run_id: str | None = None,
    on_event: Callable[[str, NodeRun | Node], None] = lambda _kind, _node: None,
    landed: Callable[[str], int | None] | None = None,
) -> PipelineRun:
    """Run the nodes `choice` names in dependency order (see RunChoice). `on_event("start", Node)` when a node is
    submitted, `on_event("end", NodeRun)` when it is done. Never raises for a node: a run the worker plane could not
    finish comes back `aborted`, the nodes it was running failed and the rest skipped.

    Exactly once: a node that changes the lake commits a token of its own (with the pipeline, run and node in its
    commit_extra_info). When its fate is unknown (its worker or the scheduler died), `landed(token)` asks the lake:
    a snapshot means it committed (recorded ok, never run again); None means it did not (failed, safe to re-run)."""
    from distributed import as_completed

    only, selector, timeout_s, among = choice.only, choice.selector, choice.timeout_s, choice.among
    run_id = run_id or new_run_id()
    record = PipelineRun(run_id, pipeline.name, pipeline.file, datetime.now(UTC), selector=selector)
    graph = pipeline.graph(only)
    sorter = TopologicalSorter(graph)
    sorter.prepare()
    rank = critical_rank(graph)
    done: dict[str, NodeRun] = {}
    running: dict[str, str] = {}  # future key -> node id
    pending = as_completed(loop=plane.client.loop)
    finished: list = []  # futures read, to release after the next submissions
    tokens: dict[str, str | None] = {}  # node -> the token its commit carries (None: it commits nothing)
    settle = functools.partial(_settle, landed=landed)
    try:
        while sorter.is_active():
            # the longest chain first: submitted first, it is also the first a free worker gets
            for node_id in sorted(sorter.get_ready(), key=lambda n: (-rank[n], pipeline.nodes[n].position)):
                node = pipeline.nodes[node_id]
                reason = _skip_reason(node_id, graph[node_id], done)
                unchanged = choice.gate(node_id, done) if reason is None and choice.gate is not None else None
                if reason is not None or unchanged is not None:
                    status = SKIPPED if reason is not None else UNCHANGED
                    done[node_id] = NodeRun(node_id, status, reason=reason or unchanged, sql=node.sql)
                    on_event("end", done[node_id])
                    sorter.done(node_id)
                    continue
                message = commit_message(pipeline.name, node_id, run_id) if node.commits else None
                tokens[node_id] = uuid.uuid4().hex if node.commits else None
                extra = {"pipeline": pipeline.name, "run": run_id, "node": node_id}
                if pipeline.env is not None:
                    extra["env"] = pipeline.env
                checks = [a.check(node.audited) for a in node.audits if node.audited is not None]
                texts = (choice.texts(node_id) if choice.texts is not None else None) or [node.sql]
                future = plane.submit(
                    [*texts, *checks],
                    worker=node.pin,
                    tag=CommitTag(message, tokens[node_id], extra) if message is not None else None,
                    timeout_s=timeout_s,
                    priority=rank[node_id],
                    among=among,
                )
                running[future.key] = node_id
                pending.add(future)
                on_event("start", node)
            if len(finished) >= RELEASE_BATCH:
                _release(finished)
            if not running:
                continue  # only skips were decided: their dependents may be ready now
            future = next(pending)
            node_id = running[future.key]
            # PlaneLost: still running, for the handler
            done[node_id] = settle(_finished(pipeline.nodes[node_id], plane, future), tokens.get(node_id))
            del running[future.key]
            finished.append(future)
            on_event("end", done[node_id])
            sorter.done(node_id)
    except Exception as exc:  # noqa: BLE001 - the plane itself failed (the scheduler went away): say what is known
        record.aborted = (
            exc.args[0] if isinstance(exc, PlaneLost) else f"the run stopped: {type(exc).__name__}: {first_line(exc)}"
        )
        for node_id in running.values():
            done[node_id] = settle(
                NodeRun(
                    node_id,
                    FAILED,
                    sql=pipeline.nodes[node_id].sql,
                    unknown=True,
                    error=(f"{record.aborted}, while this node ran; it may or may not have committed: check the lake"),
                ),
                tokens.get(node_id),
            )
        for node_id in graph:
            done.setdefault(
                node_id, NodeRun(node_id, SKIPPED, sql=pipeline.nodes[node_id].sql, reason=f"not run: {record.aborted}")
            )
    _release(finished)
    record.finished_at = datetime.now(UTC)
    record.nodes = [done[n] for n in pipeline.nodes if n in done]
    return record


def _settle(run: NodeRun, token: str | None, *, landed: Callable[[str], int | None] | None) -> NodeRun:
    """A node whose fate is unknown, decided by the lake: its token found (it committed: ok, with that snapshot) or
    not (it did not: failed, and --from-failed may run it again). A node that commits nothing changed no lake table,
    so running it again is safe either way."""
    if not run.unknown or landed is None:
        return run
    if token is None:
        run.error = f"{run.error.split(';')[0]}; it commits nothing to the lake, so running it again is safe"
        return run
    try:
        snapshot = landed(token)
    except Exception as exc:  # noqa: BLE001 - the catalog cannot say: the fate stays unknown, and is said so
        run.error = f"{run.error} (the lake could not be asked: {first_line(exc)})"
        return run
    if snapshot is None:
        run.error = (
            f"{run.error.split(';')[0]}; it did not commit (its token is not in the lake), so "
            "`--from-failed` may run it again"
        )
        return run
    run.status, run.snapshot_id, run.unknown = OK, snapshot, False
    run.reason = (
        f"{run.error.split(';')[0]}, after its commit landed: found in the lake by its token "
        f"(snapshot {snapshot}), never run again"
    )
    run.error = None
    return run


def _release(futures: list) -> None:
    """Let the workers drop results already read. In batches: the client sends to the scheduler at most every
    10 ms, so a release sent after each node would hold the next node's submission back by up to that much."""
    for future in futures:
        future.release()
    futures.clear()


class PlaneLost(Exception):
    """The client lost its scheduler: no node's outcome can be known from the plane any more."""


def _finished(node: Node, plane: WorkerPlane, future) -> NodeRun:
    """The node's outcome; a task that raised on its worker (not a SQL error: those are results) is a failed node.
    A task cancelled because the scheduler went away stops the run (PlaneLost)."""
    try:
        return _node_run(node, plane.result(future, release=False))
    except Exception as exc:  # noqa: BLE001 - e.g. cancelled by a scheduler restart: still one node's outcome
        if plane.scheduler_lost():
            raise PlaneLost(
                f"the worker plane's scheduler was lost ({type(exc).__name__}: {first_line(exc)})"
            ) from None
        return NodeRun(
            node.id,
            FAILED,
            sql=node.sql,
            unknown=True,
            error=f"the task failed on the worker plane ({type(exc).__name__}: {first_line(exc)}); it may "
            "or may not have committed: check the lake",
        )
