"""PNG plots of replays with matplotlib (Agg backend, no display needed): view tokens per model call
with folds marked, and cumulative cost. matplotlib is the optional `bench` extra."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxfold.replay.metrics import ReplayResult

DPI = 72
# Truncation happens at almost every call once it starts, so it is not marked.
MARKED = {"folded": ("v", "fold"), "pruned": ("x", "prune")}


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("plots need matplotlib: pip install 'ctxfold[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(results: Sequence[ReplayResult], path: str | Path, title: str, window: int = 0, trigger: int = 0) -> None:
    """View tokens per model call (folds, prunes and truncations marked) above cumulative cost, one
    line per result."""
    plt = pyplot()
    figure, (tokens_axis, cost_axis) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for index, r in enumerate(results):
        color = f"C{index % 10}"
        calls = list(range(1, len(r.series_view_tokens) + 1))
        tokens_axis.plot(calls, r.series_view_tokens, color=color, linewidth=1.2, label=r.policy)
        for action, (marker, _) in MARKED.items():
            xs = [c for c, a in zip(calls, r.series_actions, strict=True) if a == action]
            ys = [r.series_view_tokens[c - 1] for c in xs]
            if xs:
                tokens_axis.scatter(xs, ys, marker=marker, color=color, s=28, zorder=3)
        cost_axis.plot(calls, r.series_cumulative_cost, color=color, linewidth=1.2, label=r.policy)
    if window:
        tokens_axis.axhline(window, color="black", linewidth=0.8, linestyle="--", label=f"window {window:,}")
    if trigger:
        tokens_axis.axhline(trigger, color="grey", linewidth=0.8, linestyle=":", label=f"default trigger {trigger:,}")
    for action, (marker, label) in MARKED.items():
        if any(action in r.series_actions for r in results):
            tokens_axis.scatter([], [], marker=marker, color="black", s=28, label=label)
    tokens_axis.set_ylabel("view tokens (billed input)")
    tokens_axis.set_title(title, fontsize=10)
    tokens_axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    tokens_axis.grid(alpha=0.3)
    cost_axis.set_ylabel("cumulative cost (USD)")
    cost_axis.set_xlabel("model call")
    cost_axis.grid(alpha=0.3)
    figure.tight_layout()
    save(figure, path)
    plt.close(figure)


def save(figure: Any, path: str | Path) -> None:
    """A small PNG: rendered by Agg, then reduced to a 128-colour palette (Pillow comes with matplotlib)."""
    from PIL import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=DPI, format="png")
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=128)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=True)
