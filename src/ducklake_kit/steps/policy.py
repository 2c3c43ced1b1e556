"""NoETL's canonical v10 policies, evaluated: a task's `spec.policy.rules` (what to do with its outcome), a step's
`spec.policy.admit` (whether it runs at all) and the `set:` that writes into `ctx`.

A rule's templates see the run's names plus `output` (the task's outcome in NoETL's words: `output.status` is
"success" or "error", `output.data`, `output.error`, `output.http.status`) and `step` (the same outcome under the
step's result shape). The kit keeps one rule of its own: a task that failed and that no rule matched fails its step,
whatever `on_unmatched` says, so a failure is never hidden by a policy that did not mention it.
"""

from __future__ import annotations

from typing import Any

from ducklake_kit.steps import templates
from ducklake_kit.steps.kinds import FAILED, SUCCESS
from ducklake_kit.steps.model import EXCLUSIVE, RETRY, Admit, Policy, Rule

MAX_DELAY_S = 60.0  # the longest wait between two attempts, whatever the backoff computes


def output(status_ok: bool, data: Any, error: str | None, details: dict[str, Any] | None) -> dict[str, Any]:
    """A task's outcome as NoETL's rules read it."""
    out: dict[str, Any] = {"status": SUCCESS if status_ok else FAILED, "data": data, "error": error}
    if details and "status" in details:
        out["http"] = {"status": details["status"]}
    return out


def matching(policy: Policy, ctx: dict[str, Any]) -> list[Rule]:
    """The rules that hold for `ctx` (the first only, in exclusive mode); an `else` rule holds when none before it
    did."""
    held: list[Rule] = []
    for rule in policy.rules:
        if rule.when is None:
            if not held:
                held.append(rule)
            continue
        if templates.condition(rule.when, ctx):
            held.append(rule)
            if policy.mode == EXCLUSIVE:
                break
    return held


def retry_rule(rules: list[Rule]) -> Rule | None:
    return next((r for r in rules if r.do == RETRY), None)


def attempts_of(rule: Rule) -> int:
    """How many attempts a retry rule allows in all (NoETL's default: 3)."""
    return max(1, int(rule.attempts or 3))


def delay_s(rule: Rule, attempt: int) -> float:
    """The wait before attempt `attempt` + 1 (attempt counts from 1): `delay` seconds, grown by the backoff."""
    base = float(rule.delay if rule.delay is not None else 1.0)
    if rule.backoff == "exponential":
        base *= 2 ** (attempt - 1)
    elif rule.backoff == "linear":
        base *= attempt
    return min(MAX_DELAY_S, max(0.0, base))


def admitted(admit: Admit | None, ctx: dict[str, Any]) -> tuple[bool, int | None]:
    """(whether the step runs, the line of the rule that decided; None when no rule held: it runs)."""
    if admit is None:
        return True, None
    decided: tuple[bool, int | None] | None = None
    for when, allow, line in admit.rules:
        if when is None or templates.condition(when, ctx):
            if decided is None or (admit.mode != EXCLUSIVE and not allow):
                decided = (allow, line)
            if admit.mode == EXCLUSIVE:
                break
    return decided or (True, None)


def apply_set(sets: dict[str, Any], ctx: dict[str, Any], scopes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Render each `set:` value for `ctx` and write it where its name says: `ctx.x` (or a bare `x`) into
    scopes["ctx"], `iter.x` into scopes["iter"] (a loop iteration's own; the ctx outside a loop), `step.x` into
    scopes["step"]. Returns what was written, by name as written."""
    written = {}
    for name, template in sets.items():
        value = templates.render_value(template, ctx)
        scope, dot, key = str(name).partition(".")
        target, key = (scopes[scope], key) if dot and scope in scopes else (scopes["ctx"], str(name))
        target[key] = value
        written[str(name)] = value
    return written
