#!/usr/bin/env python3
"""How long an agent waits in Prepare, background folds on and off, side by side in one run.

`ctxfold serve` runs in its own process on SQLite with one LLM summarizer, the fake OpenAI-compatible
provider of tests/fake_provider.py, which answers every summary after `--summarizer-seconds` (2 s by
default, a fast model writing a short summary). For each trace of tests/data/traces, two sessions
replay it at once, turn by turn as an agent would: Prepare (the append of the turn; timed as the
client sees it), then the model call, which takes `--agent-seconds` (2 s) and is a sleep here. One
session has background folds off (`prefold_ratio` 0), the other the default (compact_ratio − 0.05) or `--prefold-ratio`.

Printed per mode: p50, p99 and max of every Prepare, and of the Prepares at a trigger (those that
folded or installed a fold prepared in the background), and how many of each; then the goal of
issue 26 as PASS/MISS: with background folds on, no Prepare waits for a summarizer (every one
answers within 0.5 s; a view above the hard ceiling with nothing prepared is folded offline at once),
where with them off each folding Prepare takes over `--summarizer-seconds`.

    .venv/bin/python bench/background.py                       # ~8 minutes: 3 traces, 60 turns each
    .venv/bin/python bench/background.py --traces 6 --turns 0  # every turn of every trace (long)
    .venv/bin/python bench/background.py --quick               # a smoke run of ~20 s (what the test runs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import benchlib as bl

sys.path.insert(0, str(bl.REPO / "tests"))
from ctxfold.replay.options import load_trace_file
from ctxfold.replay.rpc import to_pb
from ctxfold.replay.trace import turns
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from fake_provider import FakeProvider

GOAL_SECONDS = 0.5
MODES = ("off", "on")  # prefold_ratio 0 (background folds off); --prefold-ratio, or the server's default
AT_TRIGGER = (pb.FOLD_STAGE_PASS_STARTED, pb.FOLD_STAGE_PREPARED_INSTALLED)


@dataclass
class Latencies:
    every: list[float] = field(default_factory=list)
    at_trigger: list[float] = field(default_factory=list)
    installed_prepared: int = 0
    # Folds made offline at once (`Fold.offline`): a view the agent could not send, with nothing prepared.
    offline: int = 0
    # Prepares over the goal: the trace, turn, view tokens against the hard ceiling, and their stages.
    slow: list[str] = field(default_factory=list)


async def replay(
    stub: pb_grpc.ContextServiceAsyncStub,
    path: str,
    window: int,
    prefold: float | None,
    agent_seconds: float,
    limit: int,
) -> Latencies:
    trace = load_trace_file(path)
    config = pb.SessionConfig(
        context_window=window, summarizer="llm", system_prompt=trace.system_prompt, tools_json=trace.tools_json
    )
    if prefold is not None:
        config.prefold_ratio = prefold
    session = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session
    measured = Latencies()
    calls, _ = turns(trace)
    for turn in calls[:limit] if limit else calls:
        request = pb.PrepareRequest(session_id=session.id, append=[to_pb(m) for m in turn.append])
        started = time.perf_counter()
        events = [e async for e in stub.Prepare(request)]
        seconds = time.perf_counter() - started
        stages = [e.progress.stage for e in events if e.HasField("progress")]
        if seconds > GOAL_SECONDS:
            result = events[-1].result
            before = max((e.progress.tokens_before for e in events if e.HasField("progress")), default=0)
            above = before > result.hard_limit_tokens
            names = ",".join(
                pb.FoldStage.Name(s).removeprefix("FOLD_STAGE_") for s in stages if s != pb.FOLD_STAGE_SUMMARY_DELTA
            )
            measured.slow.append(
                f"{Path(path).name} turn {len(measured.every) + 1}: {seconds:.2f} s, view {before} tokens "
                f"({'above' if above else 'within'} the hard ceiling of {result.hard_limit_tokens}), {names}"
            )
        measured.every.append(seconds)
        if any(stage in AT_TRIGGER for stage in stages):
            measured.at_trigger.append(seconds)
        measured.installed_prepared += stages.count(pb.FOLD_STAGE_PREPARED_INSTALLED)
        measured.offline += pb.FOLD_STAGE_SUMMARIZER_FALLBACK in stages
        await asyncio.sleep(agent_seconds)  # the model call
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=session.id))
    return measured


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "n": len(ordered),
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=bl.positive_int, default=3, help="how many traces of tests/data/traces")
    parser.add_argument("--turns", type=int, default=60, help="model calls replayed per trace (0: all)")
    parser.add_argument("--window", type=bl.positive_int, default=16_000, help="the sessions' context_window")
    parser.add_argument("--summarizer-seconds", type=bl.positive_float, default=2.0)
    parser.add_argument("--agent-seconds", type=bl.positive_float, default=2.0)
    parser.add_argument(
        "--prefold-ratio", type=float, default=None, help="prefold_ratio of the 'on' sessions (default: the server's)"
    )
    parser.add_argument("--quick", action="store_true", help="1 trace, 30 turns, 0.6 s summarizer and agent")
    parser.add_argument("--json", default="", help="write the full result here")
    args = parser.parse_args()
    if args.quick:
        args.traces, args.turns, args.summarizer_seconds, args.agent_seconds = 1, 30, 0.6, 0.6
    paths = bl.trace_paths(bl.DEFAULT_TRACES)[: args.traces]
    results: dict[str, Latencies] = {mode: Latencies() for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp, FakeProvider(timeout_sleep=args.summarizer_seconds) as fake:
        fake.script(then="timeout")  # every summary answers after summarizer_seconds
        specs = json.dumps({"llm": {"type": "openai", "base_url": fake.base_url, "model": "m", "max_retries": 0}})
        database = f"sqlite:///{Path(tmp) / 'bench.db'}"
        async with bl.serve_process(database, Path(tmp) / "serve.log", *bl.QUIET, "--summarizers", specs) as served:
            stub = pb_grpc.ContextServiceStub(served.channel)
            for path in paths:
                bl.log(f"{Path(path).name}: both modes at once")
                done = await asyncio.gather(
                    *(
                        replay(
                            stub, path, args.window, args.prefold_ratio if on else 0.0, args.agent_seconds, args.turns
                        )
                        for on in (False, True)
                    )
                )
                for mode, measured in zip(MODES, done, strict=True):
                    results[mode].every += measured.every
                    results[mode].at_trigger += measured.at_trigger
                    results[mode].installed_prepared += measured.installed_prepared
                    results[mode].slow += measured.slow
                    results[mode].offline += measured.offline
    print(
        f"\nPrepare latency as the agent sees it (s): summarizer {args.summarizer_seconds:g} s per call, "
        f"agent {args.agent_seconds:g} s per model call, window {args.window:,}, {len(paths)} trace(s)"
    )
    print(f"{'background folds':<17} {'':>9} {'n':>5} {'p50':>7} {'p99':>7} {'max':>7}")
    table: dict[str, dict[str, dict[str, float]]] = {}
    for mode, measured in results.items():
        table[mode] = {"every": summary(measured.every), "at_trigger": summary(measured.at_trigger)}
        for which, row in table[mode].items():
            label = "every" if which == "every" else "at trigger"
            print(f"{mode:<17} {label:>9} {row['n']:>5.0f} {row['p50']:>7.3f} {row['p99']:>7.3f} {row['max']:>7.3f}")
    on, off = table["on"], table["off"]
    print(
        f"at a trigger (on): {results['on'].installed_prepared} prepared folds installed, "
        f"{results['on'].offline} views above the hard ceiling folded offline at once"
    )
    for line in results["on"].slow:
        print(f"  on, over {GOAL_SECONDS} s: {line}")
    slow = len(results["on"].slow)
    print(
        f"goal: with background folds on every Prepare within {GOAL_SECONDS} s: "
        f"{'PASS' if not slow else 'MISS'} ({slow} over; max {on['every']['max']:.3f} s; "
        f"off: max {off['every']['max']:.3f} s)"
    )
    if args.json:
        document = {"args": vars(args), "table": table, **{mode: asdict(r) for mode, r in results.items()}}
        await asyncio.to_thread(Path(args.json).write_text, json.dumps(document, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
