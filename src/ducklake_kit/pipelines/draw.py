"""Drawing a DAG (a pipeline's nodes, or a table's upstream lineage) to a PNG with matplotlib: layers from left to
right (a node's layer is its depth, computed by graphlib), edges as arrows, a dashed arrow for an inferred edge."""

from __future__ import annotations

from dataclasses import dataclass
from graphlib import CycleError
from pathlib import Path

from ducklake_kit.pipelines.dag import generations


@dataclass(frozen=True)
class Arrow:
    parent: str
    child: str
    dashed: bool = False


def layers(nodes: list[str], arrows: list[Arrow]) -> list[list[str]]:
    """Nodes by depth: each node one layer right of its deepest parent. Recorded lineage may hold a cycle (two
    pipelines building each other's tables): then each node goes one layer right of the nearest node with no parent."""
    parents = {n: {a.parent for a in arrows if a.child == n} for n in nodes}
    try:
        return generations(parents, nodes)
    except CycleError:
        depth = {n: 0 for n in nodes if not parents[n]} or {nodes[0]: 0}
        todo = list(depth)
        while todo:
            n = todo.pop(0)
            for a in arrows:
                if a.parent == n and a.child not in depth:
                    depth[a.child] = depth[n] + 1
                    todo.append(a.child)
        for n in nodes:
            depth.setdefault(n, 0)
        return [[n for n in nodes if depth[n] == d] for d in range(max(depth.values()) + 1)]


def draw(
    nodes: list[str],
    arrows: list[Arrow],
    path: Path,
    *,
    title: str,
    labels: dict[str, str] | None = None,
    colors: dict[str, str] | None = None,
) -> Path:
    from matplotlib.figure import Figure  # no pyplot: the process's backend (a notebook's inline one) is left alone

    cols = layers(nodes, arrows)
    height = max(len(c) for c in cols)
    pos = {n: (x, (height - 1) / 2 - y) for x, col in enumerate(cols) for y, n in enumerate(col)}
    fig = Figure(figsize=(max(4.0, 3.2 * len(cols)), max(2.5, 1.3 * height)))
    ax = fig.subplots()
    for a in arrows:
        (x0, y0), (x1, y1) = pos[a.parent], pos[a.child]
        ax.annotate(
            "",
            xy=(x1 - 0.28, y1),
            xytext=(x0 + 0.28, y0),
            arrowprops={"arrowstyle": "->", "color": "#555", "linestyle": "--" if a.dashed else "-"},
        )
    for n, (x, y) in pos.items():
        ax.text(
            x,
            y,
            (labels or {}).get(n, n),
            ha="center",
            va="center",
            fontsize=8,
            bbox={"boxstyle": "round,pad=0.4", "facecolor": (colors or {}).get(n, "#dbe9f6"), "edgecolor": "#336"},
        )
    ax.set_xlim(-0.6, len(cols) - 0.4)
    ax.set_ylim(-height / 2 - 0.2, height / 2 + 0.2)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
