"""Exactly once for steps: what a step (or one loop iteration) commits, and how the runner decides its fate when its
worker could not report it (the worker died, the plane's scheduler was lost).

A step runs as one of three kinds, chosen from its rendered statements before it is submitted:

- `decided`: one transaction carrying a token of its own (`transaction: true`, or a single statement that writes:
  INSERT, UPDATE, DELETE, MERGE, CREATE, DROP, ALTER, which autocommit would commit as one transaction anyway). Its
  token, in the snapshot's commit_extra_info with the playbook, run, step and iteration, is looked up in the lake:
  found, it committed (ok, never run again); not found, it did not (`--resume` runs it again).
- `harmless`: only statements that change nothing in the lake (SELECT, EXPLAIN, SET): running it again is safe.
- `undecided`: several statements that autocommit one by one (or a CALL, COPY, ...): no one token covers them, so the
  lake cannot say which committed. Its fate stays unknown, and `--resume` does not run it again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import duckdb

from ducklake_kit.errors import first_line
from ducklake_kit.lake import Lake
from ducklake_kit.lake.connection import WRITE_KINDS
from ducklake_kit.lake.transactions import snapshot_of_token
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.steps.task import StepTask, Target

DECIDED, HARMLESS, UNDECIDED = "decided", "harmless", "undecided"
READ_ONLY = {"SELECT", "EXPLAIN", "SET", "VARIABLE_SET"}  # DuckDB's statement types that commit nothing to the lake
UNDECIDED_WHY = (
    "its statements autocommit one by one, so the lake cannot say which of them committed (with "
    "`transaction: true` it is one commit the runner decides)"
)


@dataclass(frozen=True)
class Unit:
    """One step run, or one iteration of a loop, as the runner submits it."""

    playbook: str
    run: str  # the execution id
    step: str
    index: int | None  # the iteration (None: a step without a loop)
    element: Any
    kind: str

    @property
    def token(self) -> str:
        """The same for every attempt of this step (or iteration, by its index and element) in this run, so that
        --resume finds what an earlier attempt committed."""
        key = json.dumps([self.run, self.step, self.index, self.element], default=str, sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    @property
    def extra(self) -> dict[str, Any]:
        """What the commit says about itself, beside its token (commit_extra_info)."""
        return {"steps": self.playbook, "run": self.run, "step": self.step, "iteration": self.index}


_TYPES: dict[str, tuple[str, ...] | None] = {}  # text -> its statement types (a loop sends the same text each time)


def _types(text: str) -> tuple[str, ...] | None:
    if text not in _TYPES:
        try:
            _TYPES[text] = tuple(s.type.name for s in duckdb.extract_statements(text))
        except duckdb.Error:  # it fails on its worker before anything of it runs
            _TYPES[text] = None
    return _TYPES[text]


def kind_of(transaction: bool, texts: list[str]) -> str:
    if transaction:
        return DECIDED
    types = [t for text in texts for t in (_types(text) or ())]
    if all(t in READ_ONLY for t in types):
        return HARMLESS
    if len(types) == 1 and types[0] in WRITE_KINDS:  # autocommit makes it one commit: one token decides it
        return DECIDED
    return UNDECIDED


class Fates:
    """The lake, asked for tokens (connected on first use, from the runner's own process: the worker plane may be
    gone)."""

    def __init__(self, endpoints: Endpoints):
        self.endpoints = endpoints
        self.lake: Lake | None = None

    def close(self) -> None:
        if self.lake is not None:
            self.lake.close()

    def landed(self, unit: Unit, target: Target) -> int | None:
        """The snapshot that carries the unit's token, or None. Raises when the lake cannot be asked (or the step's
        catalog is not the kit's: the runner has no connection of its own to it)."""
        if not target.kit:
            raise RuntimeError(f"its catalog {target.describe()} is not the kit's, which the runner cannot ask")
        if self.lake is None:
            self.lake = Lake(self.endpoints)
        return snapshot_of_token(self.lake, unit.token)

    def settle(
        self, unit: Unit, target: Target, why: str, worker: str | None = None, address: str = "", *, final: bool = True
    ) -> StepTask:
        """The outcome of a task whose worker could not report it: `why` says what happened. `final`: its worker is
        gone, so a token not in the lake now never will be; False when only the scheduler was lost (the worker may
        still be finishing the task)."""
        out = StepTask(worker or "", address, transaction=unit.kind == DECIDED)
        if unit.kind == HARMLESS:
            out.error = f"{why}; it changes nothing in the lake, so running it again is safe"
            return out
        if unit.kind == UNDECIDED:
            out.error = f"{why}; {UNDECIDED_WHY}: check the lake before running it again"
            return out
        try:
            snapshot = self.landed(unit, target)
        except Exception as exc:  # noqa: BLE001 - the catalog cannot say: the fate stays unknown, and is said so
            out.error = (
                f"{why}; it may or may not have committed, and the lake could not be asked "
                f"({first_line(exc)}): check the lake before running it again"
            )
            return out
        if snapshot is None and final:
            out.error = (
                f"{why}; it did not commit (its token is not in the lake), so `steps run FILE --resume "
                f"{unit.run}` runs it again"
            )
        elif snapshot is None:
            out.error = (
                f"{why}; its token is not in the lake yet (its worker may still be finishing it): `up` stops "
                f"the old workers, then `steps run FILE --resume {unit.run}` decides it again and runs it "
                "only if it did not commit"
            )
        else:
            out.snapshot_id = snapshot
            out.note = (
                f"{why}, after its commit landed: found in the lake by its token (snapshot {snapshot}), never run again"
            )
        return out

    def before(self, unit: Unit, target: Target) -> StepTask | None:
        """--resume, before a unit runs: its outcome when it must not run again (it committed before, or the lake
        cannot say), None when it may run."""
        if unit.kind == HARMLESS:
            return None
        out = StepTask("", "", transaction=unit.kind == DECIDED)
        if unit.kind == UNDECIDED:
            out.error = (
                f"not run again: {UNDECIDED_WHY.replace('of them committed', f'of them run {unit.run} committed')}; "
                "check the lake, then run the playbook afresh"
            )
            return out
        try:
            snapshot = self.landed(unit, target)
        except Exception as exc:  # noqa: BLE001
            out.error = (
                f"not run again: the lake could not be asked whether run {unit.run} committed it ({first_line(exc)})"
            )
            return out
        if snapshot is None:
            return None
        out.snapshot_id = snapshot
        out.note = (
            f"committed by run {unit.run} before (snapshot {snapshot}, found in the lake by its token): not run again"
        )
        return out
