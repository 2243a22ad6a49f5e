#!/usr/bin/env python3
"""Tokens, prompt-cache hits, cost and what the last view still holds, for ctxfold against baseline
context policies, on the recorded agent traces in tests/data/traces, with the same turns and the same
simulated provider for all, at each context window asked for (default 16k and 32k).

ctxfold runs through a real server started in this process (temporary SQLite, extractive summarizer)
at its defaults and at two other compact ratios; the baselines (ctxfold.replay.baselines) are pure
view policies over the trace: full history with no window (the reference), summarize-everything at
the trigger (also in the variant that quotes every user message, as Claude Code's compaction does),
Anthropic's clear_tool_uses context edit, observation masking (M=10), a rolling condenser and
oldest-first truncation. Every policy's requests are recorded once and billed under each price sheet
with that sheet's provider cache rules. The probes (ctxfold.replay.probes) score each policy's last
view against the trace: task kept, the person's later instructions kept, touched file paths named,
hidden tool results reachable (ctxfold's index documents are read back through ReadToolResult).

Prints one table per trace and window and a compact summary per window, and writes
bench/results/replay.json and PNG plots (bench/results/replay-<trace>-w<window>.png,
replay-summary-w<window>.png).

    .venv/bin/python bench/replay_compare.py [--window 16000 32000] [--traces FILE_OR_DIR ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import benchlib as bl
import grpc

from ctxfold.engine.model import PREFOLD_LEAD
from ctxfold.replay import baselines, report
from ctxfold.replay.connection import CHANNEL_OPTIONS, embedded_server
from ctxfold.replay.metrics import (
    SUMMARY_FIRST_TOKEN_SECONDS,
    SUMMARY_TOKENS_PER_SECOND,
    Recording,
    ReplayResult,
    bill,
    ideal_hit_ratio,
)
from ctxfold.replay.options import Options, load_trace_file
from ctxfold.replay.prices import BUILT_IN, PriceSheet
from ctxfold.replay.runner import replay_through
from ctxfold.replay.simulator import Provider, cache_model
from ctxfold.replay.trace import Trace, turns
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

REPO = bl.REPO
DEFAULT_OUT = REPO / "bench" / "results"
SHEETS = ("deepseek-chat", "gpt-5", "claude-sonnet-4.5")
CTXFOLD_RATIOS = (0.80, 0.60, 0.90)  # the default first
WINDOWS = (16000, 32000)
BILLING_FIELDS = (
    "policy",
    "prices",
    "provider_cache",
    "cache_hit_tokens",
    "cache_miss_tokens",
    "cache_write_tokens",
    "cache_hit_ratio",
    "cost",
    "summarizer_hit_tokens",
    "summarizer_cost",
    "total_cost",
)


def ctxfold_name(ratio: float, default: bool) -> str:
    return f"ctxfold ratio {ratio:.2f}" + (" (default)" if default else "")


async def record_ctxfold(
    traces: Sequence[Trace], windows: Sequence[int], ratios: Sequence[float], think: float, quiet: bool
) -> dict[tuple[int, str], list[Recording]]:
    """Every trace through one embedded server at each window and compact ratio."""
    out: dict[tuple[int, str], list[Recording]] = {}
    async with embedded_server() as address, grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.ContextServiceStub(channel)
        for window in windows:
            for trace in traces:
                runs = out.setdefault((window, trace.name), [])
                default = ratios[0]
                variants = [
                    (ctxfold_name(ratio, index == 0), Options(window=window, ratio=ratio, think_seconds=think))
                    for index, ratio in enumerate(ratios)
                ]
                # Background folds, as an LLM summarizer has them by default (the extractive one has them off).
                prefold = round(default - PREFOLD_LEAD, 4)
                background = Options(window=window, ratio=default, think_seconds=think, prefold_ratio=prefold)
                variants.append((f"ctxfold ratio {default:.2f}, background from {prefold:.2f}", background))
                for name, options in variants:
                    started = time.monotonic()
                    _, recording = await replay_through(stub, trace, options, policy=name)
                    runs.append(recording)
                    if not quiet:
                        elapsed = time.monotonic() - started
                        print(f"  window {window}: {trace.name}: {name}: {elapsed:.1f} s", file=sys.stderr)
    return out


def record_baselines(
    trace: Trace, window: int, max_events: int, keep_recent: int, clear_at_least: int
) -> list[Recording]:
    budget = baselines.Budget(window)
    policies: list[baselines.Policy] = [
        baselines.SummarizeAll(trace, budget),
        baselines.SummarizeAll(trace, budget, keep_user_messages=True),
        baselines.ContextEditing(trace, budget, clear_at_least=clear_at_least),
        baselines.ToolMasking(trace, budget, keep_recent=keep_recent),
        baselines.RollingCondenser(trace, budget, max_events=max_events),
        baselines.Truncate(trace, budget),
        baselines.FullHistory(trace),
    ]
    recordings = [baselines.record(trace, p) for p in policies]
    recordings[-1] = dataclasses.replace(recordings[-1], policy="full-history (no window)")
    return recordings


def bill_all(
    trace: Trace, recordings: Sequence[Recording], sheets: Sequence[PriceSheet], think: float
) -> dict[str, list[ReplayResult]]:
    ideal = ideal_hit_ratio(trace)
    return {
        sheet.name: [bill(trace, r, Provider(cache_model(sheet.provider), sheet), think, ideal) for r in recordings]
        for sheet in sheets
    }


def _compact(result: ReplayResult, with_series: bool) -> dict[str, Any]:
    data = dataclasses.asdict(result)
    for key, value in data.items():
        if isinstance(value, float):
            data[key] = round(value, 6)
    if not with_series:  # another price sheet: only what billing changes
        return {key: data[key] for key in BILLING_FIELDS}
    data.pop("series_cumulative_cost")
    actions = data.pop("series_actions")
    # Which model calls (1-based) were preceded by each action; "none" is the rest.
    data["series_events"] = {
        kind: [i + 1 for i, a in enumerate(actions) if a == kind] for kind in sorted(set(actions) - {"none"})
    }
    return data


def _fraction(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def summary_rows(
    per_trace: dict[str, dict[str, list[ReplayResult]]], names: Sequence[str], window: int
) -> list[dict[str, Any]]:
    """One row per policy over all traces at one window: totals per price sheet and the probes
    (counts over all traces, and their fractions)."""
    rows = []
    for index, name in enumerate(names):
        runs = {sheet: [results[sheet][index] for results in per_trace.values()] for sheet in SHEETS}
        primary = runs[SHEETS[0]]
        counts = {
            field: sum(getattr(r, field) for r in primary)
            for field in (
                "task_kept",
                "instructions",
                "instructions_kept",
                "paths",
                "paths_named",
                "dropped_tool_results",
                "recoverable_tool_results",
            )
        }
        rows.append(
            {
                "policy": name,
                "window": window,
                "model_calls": sum(r.turns for r in primary),
                "refused_calls": sum(r.refused_calls for r in primary),
                "folds": sum(r.folds for r in primary),
                "prunes": sum(r.prunes for r in primary),
                "summarizer_calls": sum(r.summarizer_calls for r in primary),
                "summary_wait_seconds": round(sum(r.summary_wait_seconds for r in primary), 1),
                "summary_wait_max_seconds": round(max(r.summary_wait_max_seconds for r in primary), 1),
                "peak_view_tokens": max(r.peak_view_tokens for r in primary),
                "input_tokens": sum(r.input_tokens for r in primary),
                "cache_hit_ratio": {
                    sheet: round(sum(r.cache_hit_tokens for r in rs) / max(1, sum(r.input_tokens for r in rs)), 4)
                    for sheet, rs in runs.items()
                },
                "total_cost": {sheet: round(sum(r.total_cost for r in rs), 6) for sheet, rs in runs.items()},
                "summarizer_cost": {sheet: round(sum(r.summarizer_cost for r in rs), 6) for sheet, rs in runs.items()},
                "traces": len(primary),
                **counts,
                "probes": {
                    "task": _fraction(counts["task_kept"], len(primary)),
                    "instructions": _fraction(counts["instructions_kept"], counts["instructions"]),
                    "paths": _fraction(counts["paths_named"], counts["paths"]),
                    "reachable": _fraction(counts["recoverable_tool_results"], counts["dropped_tool_results"]),
                },
            }
        )
    return rows


SHEET_LABELS = {"deepseek-chat": "deepseek", "gpt-5": "gpt-5", "claude-sonnet-4.5": "sonnet"}


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def summary_table(rows: Sequence[dict[str, Any]], ideal: float) -> str:
    """The compact table of one window: cost and cache hits per price sheet, then the probes."""
    labels = [SHEET_LABELS.get(sheet, sheet[:8]) for sheet in SHEETS]
    head = f"{'policy':<41}{'refused':>8}{'folds':>6}{'wait s':>8}{'max s':>7}{'input':>11}"
    head += "".join(f"{'$ ' + label:>11}" for label in labels) + "".join(f"{'hit ' + label:>13}" for label in labels)
    head += f"{'task':>6}{'instr':>7}{'paths':>7}{'reach':>7}"
    lines = [head, "-" * len(head)]
    for row in rows:
        line = f"{row['policy']:<41}{row['refused_calls']:>8}{row['folds']:>6}"
        line += f"{row['summary_wait_seconds']:>8.0f}{row['summary_wait_max_seconds']:>7.0f}{row['input_tokens']:>11,}"
        line += "".join(f"{row['total_cost'][sheet]:>11.4f}" for sheet in SHEETS)
        line += "".join(f"{100 * row['cache_hit_ratio'][sheet]:>12.1f}%" for sheet in SHEETS)
        probes = row["probes"]
        line += f"{_pct(probes['task']):>6}{_pct(probes['instructions']):>7}"
        line += f"{_pct(probes['paths']):>7}{_pct(probes['reachable']):>7}"
        lines.append(line)
    # A policy that left the agent stuck at some turn (a refused call) is no candidate, however cheap.
    windowed = [row for row in rows if not row["policy"].startswith("full-history") and not row["refused_calls"]]
    cheapest = "; ".join(
        f"{label} {min(windowed, key=lambda r: r['total_cost'][sheet])['policy']}"
        for sheet, label in zip(SHEETS, labels, strict=True)
    )
    lines.append(f"cheapest within the window, of the policies that never refused a call: {cheapest}")
    lines.append(f"ideal cache-hit ratio over all traces (full history, token granularity): {100 * ideal:.1f}%")
    lines.append(
        "refused: model calls the policy could not make (a failed Prepare; a view above the window, which the "
        "provider refuses), billed nothing; wait s / max s: what the agent waited for summaries in all and "
        f"before one call at most (modeled: {SUMMARY_FIRST_TOKEN_SECONDS:g} s to the first token, then "
        f"{SUMMARY_TOKENS_PER_SECOND:g} tokens/s; a summary made in the background is not waited for); "
        "task: traces whose opening user message the last view keeps; instr: "
        "the person's later messages kept; paths: touched paths the view names; reach: hidden tool results "
        "reachable from the view"
    )
    return "\n".join(lines)


def plot_summary(rows: Sequence[dict[str, Any]], path: Path, ideal: float) -> None:
    from ctxfold.replay.plot import pyplot, save

    plt = pyplot()
    names = [r["policy"] for r in rows]
    figure, (cost_axis, hit_axis) = plt.subplots(1, 2, figsize=(10, 3.8))
    height = 0.8 / len(SHEETS)
    for s, sheet in enumerate(SHEETS):
        base = rows[0]["total_cost"][sheet] or 1.0
        ys = [i + s * height for i in range(len(rows))]
        cost_axis.barh(ys, [r["total_cost"][sheet] / base for r in rows], height, label=sheet)
        hit_axis.barh(ys, [100 * r["cache_hit_ratio"][sheet] for r in rows], height, label=sheet)
    for axis in (cost_axis, hit_axis):
        axis.set_yticks([i + height for i in range(len(rows))], names, fontsize=7)
        axis.invert_yaxis()
        axis.grid(axis="x", alpha=0.3)
    cost_axis.set_xlabel(f"total cost, all traces, relative to {names[0]}")
    cost_axis.axvline(1.0, color="black", linewidth=0.8)
    hit_axis.set_xlabel("cache-hit ratio (%)")
    hit_axis.axvline(100 * ideal, color="black", linestyle="--", linewidth=0.8, label=f"ideal {100 * ideal:.1f}%")
    hit_axis.set_yticklabels([])
    handles, labels = hit_axis.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    save(figure, path)
    plt.close(figure)


def dumps(document: dict[str, Any]) -> str:
    """Indented JSON with every list of numbers on one line (the per-call series stay small)."""
    text = json.dumps(document, indent=1)
    return re.sub(
        r"\[\s*(-?[\d.]+(?:,\s*-?[\d.]+)*)\s*\]",
        lambda m: "[" + ", ".join(number.strip() for number in m[1].split(",")) + "]",
        text,
    )


def git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, check=False
        )
    except OSError:
        return ""
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def trace_files(given: Sequence[Path]) -> list[Path]:
    files: list[Path] = []
    for path in given:
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    return files


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--traces", type=Path, nargs="+", default=[bl.DEFAULT_TRACES], help="trace files or directories"
    )
    parser.add_argument(
        "--window", type=int, nargs="+", default=list(WINDOWS), help="context windows (default 16000 32000)"
    )
    parser.add_argument(
        "--ratios", type=float, nargs="+", default=list(CTXFOLD_RATIOS), help="ctxfold compact ratios, default first"
    )
    parser.add_argument("--max-events", type=int, default=100, help="rolling condenser: messages before it condenses")
    parser.add_argument("--keep-recent", type=int, default=10, help="masking: newest tool outputs kept (M)")
    parser.add_argument(
        "--clear-at-least",
        type=int,
        default=baselines.CLEAR_AT_LEAST_TOKENS,
        help="clear-tool-uses: fewest tokens a clearing must free",
    )
    parser.add_argument("--think-seconds", type=float, default=10.0, help="simulated time between model calls")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where replay.json and the plots go")
    parser.add_argument("--no-plots", action="store_true", help="write no PNG")
    parser.add_argument("--quiet", action="store_true", help="no per-run timings on stderr")
    args = parser.parse_args(argv)

    traces = [load_trace_file(p) for p in trace_files(args.traces)]
    if not traces:
        parser.exit(2, "no traces found\n")
    if any(w <= 0 for w in args.window):
        parser.exit(2, "--window must be > 0\n")
    sheets = [BUILT_IN[s] for s in SHEETS]
    started = time.monotonic()
    ctxfold_runs = asyncio.run(record_ctxfold(traces, args.window, args.ratios, args.think_seconds, args.quiet))
    rows: list[dict[str, Any]] = []
    documents = []
    tables = []
    for window in args.window:
        per_trace: dict[str, dict[str, list[ReplayResult]]] = {}
        for trace in traces:
            recordings = ctxfold_runs[(window, trace.name)] + record_baselines(
                trace, window, args.max_events, args.keep_recent, args.clear_at_least
            )
            results = bill_all(trace, recordings, sheets, args.think_seconds)
            per_trace[trace.name] = results
            primary = results[SHEETS[0]]
            title = (
                f"{trace.name}: {len(turns(trace)[0])} model calls, window {window:,}, prices {SHEETS[0]}; "
                f"ideal cache-hit ratio {100 * primary[0].ideal_cache_hit_ratio:.1f}%"
            )
            print(report.comparison(primary, title) + "\n")
            documents.append(
                {
                    "trace": trace.name,
                    "window": window,
                    "messages": len(trace.messages) + (1 if trace.system_prompt else 0),
                    "model_calls": len(turns(trace)[0]),
                    "ideal_cache_hit_ratio": round(primary[0].ideal_cache_hit_ratio, 6),
                    "results": [_compact(r, with_series=True) for r in primary],
                    "other_sheets": {s: [_compact(r, with_series=False) for r in results[s]] for s in SHEETS[1:]},
                }
            )
            if not args.no_plots:
                from ctxfold.replay.plot import plot

                args.out.mkdir(parents=True, exist_ok=True)
                shown = [r for r in primary if not r.policy.startswith("full-history")]
                plot(
                    shown,
                    args.out / f"replay-{Path(trace.name).stem}-w{window}.png",
                    f"{trace.name}, window {window:,}, compact_ratio 0.80, {SHEETS[0]} prices",
                    window=window,
                    compact_ratio=0.80,
                )
        names = [r.policy for r in next(iter(per_trace.values()))[SHEETS[0]]]
        window_rows = summary_rows(per_trace, names, window)
        rows += window_rows
        ideal = ideal_over(per_trace)
        tables.append(f"summary: {len(traces)} traces, window {window:,}, total cost in $ under each price sheet\n")
        tables[-1] += summary_table(window_rows, ideal)
        if not args.no_plots:
            plot_summary(window_rows, args.out / f"replay-summary-w{window}.png", ideal)
    print("\n\n".join(tables))
    print("\n" + "\n".join(f"  {s.name}: {s.source}" for s in sheets))
    args.out.mkdir(parents=True, exist_ok=True)
    document = {
        "generated_by": "bench/replay_compare.py",
        "commit": git_commit(),
        "seconds": round(time.monotonic() - started, 1),
        "settings": {
            "windows": args.window,
            "ctxfold_ratios": args.ratios,
            "rolling_max_events": args.max_events,
            "masking_keep_recent": args.keep_recent,
            "clear_at_least": args.clear_at_least,
            "think_seconds": args.think_seconds,
            "summarizer": "extractive",
        },
        "price_sheets": {s.name: dataclasses.asdict(s) for s in sheets},
        "summary": rows,
        "traces": documents,
    }
    (args.out / "replay.json").write_text(dumps(document) + "\n")


def ideal_over(per_trace: dict[str, dict[str, list[ReplayResult]]]) -> float:
    """The ideal cache-hit ratio over all traces, weighted by the full history's input tokens."""
    references = [results[SHEETS[0]][-1] for results in per_trace.values()]
    total = sum(r.input_tokens for r in references)
    return sum(r.ideal_cache_hit_ratio * r.input_tokens for r in references) / total if total else 0.0


if __name__ == "__main__":
    main()
