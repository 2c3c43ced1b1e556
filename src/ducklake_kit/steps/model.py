"""The kit's own model of a playbook: what the runner runs, whatever shape the YAML had (NoETL's v1 or v2 are
adapters onto it, see `noetl`). Templates stay text here; they are rendered when their step runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KIT_AUTH = "kit"  # the credential name of the kit's own catalog (the default when a step names none)
ASYNC, SEQUENTIAL = "async", "sequential"
EXCLUSIVE, INCLUSIVE = "exclusive", "inclusive"
# the tool kinds the kit runs (NoETL's names); NoETL's other kinds (snowflake, gcs, nats, container, ...) are refused
# at validate, in one line naming the kind and the step
DUCKLAKE, POSTGRES, DUCKDB, PYTHON, HTTP, NOOP, PLAYBOOK, WORKBOOK = (
    "ducklake",
    "postgres",
    "duckdb",
    "python",
    "http",
    "noop",
    "playbook",
    "workbook",
)
KINDS = (DUCKLAKE, POSTGRES, DUCKDB, PYTHON, HTTP, NOOP, PLAYBOOK, WORKBOOK)
TASKS = "tasks"  # a step whose tool is a list of labelled tasks (NoETL's tool pipeline): `Step.tasks`, run in order
# a policy rule's actions (NoETL's `then.do`)
RETRY, JUMP, BREAK, FAIL, CONTINUE = "retry", "jump", "break", "fail", "continue"


@dataclass
class Rule:
    """One rule of a tool's `spec.policy.rules`: when `when` renders true (None: the `else` rule), `do` it.
    Templates see the task's `output` (`output.status`, `output.data`, `output.error`) and the run's names."""

    when: str | None
    do: str = CONTINUE  # retry | jump | break | fail | continue
    attempts: int | None = None  # retry: attempts in all, the first included (NoETL's `attempts`)
    backoff: str | None = None  # retry: "fixed" | "linear" | "exponential" (NoETL's names)
    delay: float | None = None  # retry: seconds before the first retry
    to: str | None = None  # jump: the step to go to
    set: dict[str, Any] = field(default_factory=dict)  # "ctx.name" (or "name") -> template, into the run's ctx
    line: int = 0


@dataclass
class Policy:
    """`tool.spec.policy`: the first rule that holds (exclusive) or every one that holds (inclusive); with none,
    `on_unmatched` (continue or fail). Without a policy a task that failed fails its step."""

    rules: list[Rule]
    mode: str = EXCLUSIVE
    on_unmatched: str = CONTINUE
    line: int = 0


@dataclass
class Admit:
    """`spec.policy.admit`: whether the step runs when the run reaches it (`then: {allow: ...}`; no rule held:
    it runs). A step not admitted is skipped, with the rule's line as the reason."""

    rules: list[tuple[str | None, bool, int]]  # (when, allow, line); when None: the `else` rule
    mode: str = EXCLUSIVE


@dataclass
class Catalog:
    """Which DuckLake catalog a step runs against, as written (templates allowed): `auth` (a credential name) or
    `catalog_connection` (a PostgreSQL DSN); `name` is the ATTACH alias the SQL uses."""

    auth: str | None = None
    connection: str | None = None
    name: str = "lake"
    data_path: str | None = None
    create: bool = True  # create the catalog's tables when they do not exist yet (DuckLake's CREATE_IF_NOT_EXISTS)
    use: bool = True  # `USE name` before the commands, so unqualified names are the catalog's


@dataclass
class Loop:
    collection: Any  # a template that renders to a list, or a list (each item may be a template)
    iterator: str  # the name each element has in the templates (also `loop.element`)
    mode: str = SEQUENTIAL  # async: iterations run in parallel on the workers, up to max_in_flight
    max_in_flight: int | str | None = None  # None: as many as there are workers; a str is a template (NoETL allows it)
    line: int = 0
    cursor: dict[str, Any] | None = None  # NoETL's pull-model source {kind, auth, claim} instead of a collection


@dataclass
class Branch:
    """`next`: go to `steps` when `when` renders true (None: always); `set` (an arc's `set:`, "ctx.x" -> template)
    is rendered into the run's ctx when the arc is taken."""

    steps: list[str]
    when: str | None = None
    line: int = 0
    set: dict[str, Any] = field(default_factory=dict)


@dataclass
class Next:
    """Where the run goes after a step. `always` are followed whatever happened; of the `branches`, the first whose
    `when` holds (exclusive) or every one that holds (inclusive); `otherwise` when none held."""

    always: list[Branch] = field(default_factory=list)
    branches: list[Branch] = field(default_factory=list)
    otherwise: list[Branch] = field(default_factory=list)
    mode: str = EXCLUSIVE
    on_no_match: str = "complete"  # NoETL's `next.spec.on_no_match`: complete | quiet (both end the branch here)

    def targets(self) -> list[tuple[str, int]]:
        """Every step it may lead to, with the line that names it."""
        return [(s, b.line) for b in (*self.always, *self.branches, *self.otherwise) for s in b.steps]


@dataclass
class Step:
    name: str
    line: int
    desc: str = ""
    tool: str | None = None  # the tool's kind (one of KINDS), or None for a step that only routes (NoETL's start/end)
    config: dict[str, Any] = field(default_factory=dict)  # a non-ducklake tool's own keys as written (templates):
    # postgres {auth, command|commands}, duckdb {command|commands}, python {code, input|args}, http {method, url,
    # headers, params, payload|data|json, timeout}, playbook {path, args}, workbook {name, ...}
    policy: Policy | None = None  # tool.spec.policy
    admit: Admit | None = None  # spec.policy.admit
    input: dict[str, Any] = field(default_factory=dict)  # step (or tool) `input:` bindings, rendered before the tool
    set: dict[str, Any] = field(default_factory=dict)  # step `set:` after it completed: "ctx.x" -> template
    tasks: list[Step] = field(default_factory=list)  # tool: a list of labelled tasks (tool TASKS), each its own kind
    catalog: Catalog = field(default_factory=Catalog)
    commands: list[str] = field(default_factory=list)  # templates; each may hold several statements
    command_lines: list[int] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)  # bound as prepared-statement parameters ($name)
    memory_limit: str | None = None
    threads: int | None = None
    loop: Loop | None = None
    vars: dict[str, str] = field(default_factory=dict)  # name -> template over this step's `result`
    next: Next | None = None  # None: the step after it in the file
    transaction: bool = False  # all commands in one transaction: one snapshot or nothing
    on_error: str = "stop"  # or "continue": run the later commands after a failed one
    lines: dict[str, int] = field(default_factory=dict)  # key -> line, for errors
    output: dict[str, Any] = field(default_factory=dict)  # tool.output as written (NoETL's result storage: not run)
    label: str | None = None  # the task's `name:` when the tool was written as a list of one labelled task


@dataclass
class Playbook:
    name: str
    file: str
    shape: str  # "v1", "v2" (NoETL's) or "v1+v2" when steps of both appear
    api_version: str | None
    workload: dict[str, Any]
    steps: dict[str, Step]  # in file order
    description: str = ""
    labels: dict[str, Any] = field(default_factory=dict)  # metadata.labels (and metadata.tags as given)
    keychain: list[dict[str, Any]] = field(default_factory=list)  # top-level keychain entries, as written
    workbook: dict[str, Step] = field(default_factory=dict)  # top-level workbook tasks by name (`tool: workbook`)
    executor: dict[str, Any] = field(default_factory=dict)  # top-level executor as written (NoETL's runtime profile)

    @property
    def start(self) -> str:
        """NoETL starts at the step named `start`; without one, the first step."""
        return "start" if "start" in self.steps else next(iter(self.steps))
