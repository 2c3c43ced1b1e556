"""What every suite shares: the schema benchmarks write (never `main`), the machine header printed beside every
figure (cores, load average before and after), the result writer (JSON, PNG chart), and the renderer-neutral
Report a suite run hands the CLI (bench/reports.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_SCHEMA = "bench"  # lake.bench.*: the suites' tables, never main.trips


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


@dataclass(frozen=True)
class Machine:
    """The header of every result: cores, and the load average (1, 5, 15 min) before the run and after it."""

    cores: int | None
    load_average_before: list[float]
    load_average_after: list[float]

    @classmethod
    def since(cls, load_before: tuple[float, float, float]) -> Machine:
        return cls(os.cpu_count(), [round(x, 2) for x in load_before], [round(x, 2) for x in os.getloadavg()])

    def as_dict(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "load_average_before": self.load_average_before,
            "load_average_after": self.load_average_after,
        }


@dataclass(frozen=True)
class Outputs:
    """Where a suite writes its result: JSON (`--out`) and a chart (`--png`); None: not written."""

    json: Path | None = None
    png: Path | None = None


NOT_WRITTEN = Outputs()


def write_outputs(
    result: Any, json_path: Path | None, png_path: Path | None, chart: Callable[[Any, Path], None] | None = None
) -> None:
    """The result (a dict, or a dataclass with `as_dict()`) as JSON to `json_path` and, with a chart function, a
    PNG to `png_path` (folders created)."""
    if json_path:
        doc = result.as_dict() if hasattr(result, "as_dict") else result
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(doc, indent=2, default=str))
    if png_path and chart is not None:
        Path(png_path).parent.mkdir(parents=True, exist_ok=True)
        chart(result, Path(png_path))


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Report:
    """What one suite run shows, for any renderer. `figures` is the suite's own typed result (LoadBench, ...);
    `notes` are printed under the table; `defect` is a computed check that failed (the command exits 1; `fix` says
    what to do); `passed`, printed only when there is no defect, is what the run proved."""

    figures: Any
    table: Table
    notes: list[str]
    document: dict[str, Any]  # the --json result and the --out file
    written: list[Path] = field(default_factory=list)
    defect: str | None = None
    fix: str = "see the JSON results (--out FILE)"
    passed: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return self.document
