"""Text tables of replay results, pure."""

from __future__ import annotations

from collections.abc import Sequence

from ctxfold.replay.metrics import SUMMARY_FIRST_TOKEN_SECONDS, SUMMARY_TOKENS_PER_SECOND, ReplayResult


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _ratio(part: int, whole: int) -> str:
    return f"{part}/{whole}" if whole else "n/a"


def _of(part: int, whole: int) -> str:
    return f"{part}/{whole} ({_pct(part / whole)})" if whole else "n/a (none)"


def _money(value: float) -> str:
    return f"${value:.4f}"


def single(r: ReplayResult, price_source: str = "") -> str:
    """The end-of-replay table of `ctxfold replay`."""
    settings = ", ".join(f"{k} {v}" for k, v in r.settings.items())
    rows = [
        ("turns (model calls)", f"{r.turns:,}"),
        ("refused (the agent was stuck)", f"{r.refused_calls:,}"),
        ("folds", f"{r.folds:,}"),
        ("prunes", f"{r.prunes:,}"),
        (
            "summarizer calls",
            f"{r.summarizer_calls:,}"
            + (f" ({r.failed_summaries} failed)" if r.failed_summaries else "")
            + (f" ({r.unused_summaries} made in the background, never installed)" if r.unused_summaries else ""),
        ),
        (
            "waited for summaries (modeled)",
            f"{r.summary_wait_seconds:,.0f} s in all, {r.summary_wait_max_seconds:,.0f} s before one call at most "
            f"(first token {SUMMARY_FIRST_TOKEN_SECONDS:g} s, then {SUMMARY_TOKENS_PER_SECOND:g} tokens/s)",
        ),
        ("longest Prepare (measured)", f"{r.prepare_max_seconds:.3f} s"),
        ("peak view tokens", f"{r.peak_view_tokens:,}"),
        ("mean view tokens", f"{r.mean_view_tokens:,.0f}"),
        ("summary tokens (last view)", f"{r.summary_tokens:,}"),
        ("summary tokens (all written)", f"{r.summary_output_tokens:,}"),
        ("billed input tokens", f"{r.input_tokens:,}"),
        ("  cache hits", f"{r.cache_hit_tokens:,} ({_pct(r.cache_hit_ratio)}; ideal {_pct(r.ideal_cache_hit_ratio)})"),
        (
            "  cache misses",
            f"{r.cache_miss_tokens:,}" + (f" ({r.cache_write_tokens:,} written)" if r.cache_write_tokens else ""),
        ),
        ("output tokens", f"{r.output_tokens:,}"),
        ("cost of model calls", _money(r.cost)),
        ("cost of summary requests", f"{_money(r.summarizer_cost)} (modeled as LLM calls)"),
        ("total cost", _money(r.total_cost)),
        ("task (opening user message) kept", "yes" if r.task_kept else "no"),
        ("person's later instructions kept", _of(r.instructions_kept, r.instructions)),
        ("touched file paths named", _of(r.paths_named, r.paths)),
        ("hidden tool results reachable", _of(r.recoverable_tool_results, r.dropped_tool_results)),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [
        f"ctxfold replay of {r.trace} ({settings})",
        f"prices: {r.prices}{f' ({price_source})' if price_source else ''}; provider cache: {r.provider_cache}",
    ]
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)


COLUMNS = (
    ("policy", 41),
    ("calls", 5),
    ("folds", 5),
    ("summ", 4),
    ("peak", 7),
    ("mean", 7),
    ("input", 10),
    ("hit%", 6),
    ("cost $", 8),
    ("summ $", 7),
    ("total $", 8),
    ("task", 4),
    ("instr", 5),
    ("paths", 7),
    ("reachable", 9),
)


def comparison(results: Sequence[ReplayResult], title: str = "") -> str:
    """One row per policy: cost, then the probes of its last view (task kept, the person's later
    instructions kept, touched paths named, hidden tool results reachable)."""
    header = "  ".join(f"{name:<{w}}" if i == 0 else f"{name:>{w}}" for i, (name, w) in enumerate(COLUMNS))
    lines = [title] if title else []
    lines += [header, "-" * len(header)]
    notes = [f"{r.policy}: {r.refused_calls}" for r in results if r.refused_calls]
    for r in results:
        cells = (
            r.policy,
            f"{r.turns}",
            f"{r.folds}",
            f"{r.summarizer_calls}",
            f"{r.peak_view_tokens:,}",
            f"{r.mean_view_tokens:,.0f}",
            f"{r.input_tokens:,}",
            _pct(r.cache_hit_ratio),
            f"{r.cost:.4f}",
            f"{r.summarizer_cost:.4f}",
            f"{r.total_cost:.4f}",
            "yes" if r.task_kept else "no",
            _ratio(r.instructions_kept, r.instructions),
            _ratio(r.paths_named, r.paths),
            _ratio(r.recoverable_tool_results, r.dropped_tool_results),
        )
        lines.append(
            "  ".join(
                f"{cell:<{w}}" if i == 0 else f"{cell:>{w}}"
                for i, (cell, (_, w)) in enumerate(zip(cells, COLUMNS, strict=True))
            )
        )
    if notes:
        lines.append(
            "refused calls (a failed Prepare, or a view above the window the provider refuses; not billed, the "
            "agent is stuck at that turn): " + "; ".join(notes)
        )
    return "\n".join(lines)
