"""PNG plots of replays with matplotlib (Agg backend, no display needed): view tokens per model call
with folds marked, the prompt-cache hits of each call, and cumulative cost. matplotlib is the
optional `bench` extra."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxfold.replay.metrics import ReplayResult

DPI = 72
# Truncation happens at almost every call once it starts, so it is not marked.
MARKED = {"folded": ("v", "fold"), "pruned": ("x", "prune")}


class PlotError(Exception):
    """The plot cannot be drawn or written; the message says why."""


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotError("plots need matplotlib: pip install 'ctxfold[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def writable(path: str | Path) -> Path:
    """`path` made absolute, once its folder is known to exist: a plot never creates folders."""
    target = Path(path).expanduser().resolve()
    if not target.parent.is_dir():
        raise PlotError(f"the folder {target.parent} does not exist; create it first")
    return target


def hit_percentages(result: ReplayResult) -> list[float]:
    """The share of each call's billed input served from the provider's prompt cache, in percent."""
    return [
        100.0 * hit / tokens if tokens else 0.0
        for hit, tokens in zip(result.series_cache_hit_tokens, result.series_view_tokens, strict=True)
    ]


def plot(
    results: Sequence[ReplayResult],
    path: str | Path,
    title: str,
    window: int = 0,
    compact_ratio: float = 0.0,
) -> Path:
    """View tokens per model call (folds and prunes marked, the window and the fold trigger
    compact_ratio × window drawn) above the cache hits of each call and the cumulative cost, one
    line per result. Returns the absolute path written."""
    target = writable(path)
    plt = pyplot()
    figure, (tokens_axis, hits_axis, cost_axis) = plt.subplots(
        3, 1, figsize=(11, 8.5), sharex=True, gridspec_kw={"height_ratios": [3, 2, 2]}
    )
    for index, r in enumerate(results):
        color = f"C{index % 10}"
        calls = list(range(1, len(r.series_view_tokens) + 1))
        tokens_axis.plot(calls, r.series_view_tokens, color=color, linewidth=1.2, label=r.policy)
        for action, (marker, _) in MARKED.items():
            xs = [c for c, a in zip(calls, r.series_actions, strict=True) if a == action]
            ys = [r.series_view_tokens[c - 1] for c in xs]
            if xs:
                tokens_axis.scatter(xs, ys, marker=marker, color=color, s=28, zorder=3)
                hits_axis.scatter(xs, [hit_percentages(r)[c - 1] for c in xs], marker=marker, color=color, s=28)
        hits_axis.plot(calls, hit_percentages(r), color=color, linewidth=1.0)
        cost_axis.plot(calls, r.series_cumulative_cost, color=color, linewidth=1.2, label=r.policy)
    if window:
        tokens_axis.axhline(window, color="black", linewidth=0.8, linestyle="--", label=f"window {window:,}")
        if compact_ratio:
            trigger = int(compact_ratio * window)
            label = f"fold trigger {compact_ratio:.2f} × window = {trigger:,}"
            tokens_axis.axhline(trigger, color="grey", linewidth=0.8, linestyle=":", label=label)
    for action, (marker, label) in MARKED.items():
        if any(action in r.series_actions for r in results):
            tokens_axis.scatter([], [], marker=marker, color="black", s=28, label=label)
    tokens_axis.set_ylabel("view tokens (billed input)")
    tokens_axis.set_title(title, fontsize=10)
    tokens_axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    tokens_axis.grid(alpha=0.3)
    hits_axis.set_ylabel("prompt-cache hits (% of the call)")
    hits_axis.set_ylim(-3, 103)
    hits_axis.grid(alpha=0.3)
    cost_axis.set_ylabel("cumulative cost (USD)")
    cost_axis.set_xlabel("model call")
    cost_axis.grid(alpha=0.3)
    figure.tight_layout()
    save(figure, target)
    plt.close(figure)
    return target


def save(figure: Any, path: str | Path) -> None:
    """A small PNG: rendered by Agg, then reduced to a 128-colour palette (Pillow comes with matplotlib).
    The folder must exist."""
    from PIL import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=DPI, format="png")
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=128)
    try:
        image.save(path, format="PNG", optimize=True)
    except OSError as exc:
        raise PlotError(f"cannot write {path}: {exc.strerror or exc}") from None
