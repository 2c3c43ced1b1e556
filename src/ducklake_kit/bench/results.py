"""What every suite shares: the schema benchmarks write (never `main`), the machine header printed beside every
figure (cores, load average before and after), and the result writer (JSON, PNG chart)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_SCHEMA = "bench"  # lake.bench.*: the suites' tables, never main.trips


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """The header of a result: cores and the load average (1, 5, 15 min) before the run and now."""
    return {
        "cores": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def write_outputs(result: dict[str, Any], json_path: Path | None, png_path: Path | None,
                  chart: Callable[[dict[str, Any], Path], None] | None = None) -> None:
    """The result as JSON to `json_path` and, with a chart function, a PNG to `png_path` (folders created)."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=2, default=str))
    if png_path and chart is not None:
        Path(png_path).parent.mkdir(parents=True, exist_ok=True)
        chart(result, Path(png_path))
