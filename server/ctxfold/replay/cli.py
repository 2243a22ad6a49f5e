"""`ctxfold replay`: arguments, then the replay, then the table (or JSON) and the plot."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Literal

from ctxfold.config import TOKEN_ENV
from ctxfold.replay.prices import BUILT_IN, DEFAULT_SHEET, PROVIDERS, PriceError, PriceSheet

if TYPE_CHECKING:  # the replay machinery is imported by the command, not by `ctxfold serve`
    from ctxfold.replay.options import Options

# W3C Trace Context, version 00: a trace id and a parent span id that are not all zeros, and flags.
TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a recorded conversation and report tokens, prompt-cache hits and cost",
        description=(
            "Replay a recorded conversation (OpenAI chat JSON {messages, tools} or JSONL, one message per line) "
            "through a ctxfold server turn by turn, as an agent would, with a simulated provider prompt cache; "
            "print turns, folds, prunes, view tokens, cache hits and misses, and cost."
        ),
    )
    p.add_argument("trace", help="the conversation file (.json or .jsonl)")
    p.add_argument("--server", default="", help="address of a running server (host:port); default: an embedded one")
    p.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV, ""), help=f"bearer token for --server (default: ${TOKEN_ENV})"
    )
    p.add_argument("--tls-ca", default="", help="PEM CA bundle: connect to --server with TLS")
    p.add_argument(
        "--traceparent",
        default="",
        metavar="00-TRACE_ID-SPAN_ID-FLAGS",
        help="a W3C traceparent: every call of the replay continues that trace (one trace in Jaeger)",
    )
    p.add_argument("--summarizers", default="", help="the embedded server's summarizers setting (JSON)")
    p.add_argument("--window", type=int, default=32000, help="context_window of the session (default 32000)")
    p.add_argument("--ratio", type=float, default=0.0, help="compact_ratio (default: the server's, 0.80)")
    p.add_argument("--tail-ratio", type=float, default=0.0, help="tail_ratio (default: the server's, 0.08)")
    p.add_argument("--max-output-tokens", type=int, default=0, help="max_output_tokens of the session (default 0)")
    p.add_argument("--summary-max-tokens", type=int, default=0, help="summary_max_tokens (default: the server's)")
    p.add_argument("--summarizer", default="", help="the session's summarizer (default extractive)")
    p.add_argument(
        "--prefold-ratio",
        type=float,
        default=None,
        help="prefold_ratio: where a fold starts in the background (default: the server's; 0 turns it off)",
    )
    p.add_argument(
        "--prices",
        default=DEFAULT_SHEET,
        help=f"price sheet: one of {', '.join(BUILT_IN)} or a JSON file (default {DEFAULT_SHEET})",
    )
    p.add_argument(
        "--provider-cache", choices=PROVIDERS, default=None, help="prompt-cache rules (default: the price sheet's)"
    )
    p.add_argument(
        "--cache-ttl",
        type=float,
        default=None,
        help="cache TTL in seconds (default: the provider's; 0 = never expires)",
    )
    p.add_argument("--think-seconds", type=float, default=10.0, help="simulated time between model calls (default 10)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    p.add_argument(
        "--plot",
        default="",
        metavar="PATH.png",
        help="also draw view tokens, cache hits per call and cumulative cost into PATH.png, whose folder must "
        "exist (default: no plot)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Exits 2 with one line for an argument the replay cannot use, before it runs (it can take minutes)."""
    if args.window <= 0:
        parser.exit(2, "ctxfold replay: --window must be > 0\n")
    if args.traceparent and not TRACEPARENT.fullmatch(args.traceparent):
        why = "not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)"
        parser.exit(2, f"ctxfold replay: --traceparent: {why}: {args.traceparent!r}\n")
    if args.plot:
        from ctxfold.replay.plot import PlotError, pyplot, writable

        try:
            writable(args.plot)
            pyplot()
        except PlotError as exc:
            parser.exit(2, f"ctxfold replay: --plot: {exc}\n")


def _options(args: argparse.Namespace, prices: PriceSheet) -> Options:
    from ctxfold.replay.options import Options

    ttl: float | Literal["default"] | None = "default"
    if args.cache_ttl is not None:
        ttl = None if args.cache_ttl == 0 else args.cache_ttl
    return Options(
        window=args.window,
        ratio=args.ratio,
        tail_ratio=args.tail_ratio,
        max_output_tokens=args.max_output_tokens,
        summary_max_tokens=args.summary_max_tokens,
        summarizer=args.summarizer,
        prefold_ratio=args.prefold_ratio,
        prices=prices,
        provider_cache=args.provider_cache or "",
        cache_ttl=ttl,
        think_seconds=args.think_seconds,
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # Imported here so that `ctxfold serve` does not load the replay machinery.
    from ctxfold.replay import report
    from ctxfold.replay.options import ReplayError, load_prices, load_trace_file
    from ctxfold.replay.runner import replay
    from ctxfold.replay.trace import TraceError

    try:
        trace = load_trace_file(args.trace)
        prices = load_prices(args.prices)
    except (ReplayError, TraceError, PriceError) as exc:
        parser.exit(2, f"ctxfold replay: {exc}\n")
    _check(args, parser)
    options = _options(args, prices)
    show_progress = not args.quiet and sys.stderr.isatty()
    try:
        result = asyncio.run(
            replay(
                trace,
                options,
                args.server,
                args.token,
                args.tls_ca,
                args.summarizers,
                show_progress,
                traceparent=args.traceparent,
            )
        )
    except ReplayError as exc:
        print(f"ctxfold replay: {exc}", file=sys.stderr)
        return 1
    if args.plot:
        from ctxfold.replay.plot import PlotError, plot

        ratio = float(result.settings["ratio"])  # type: ignore[arg-type]
        try:
            written = plot(
                [result],
                args.plot,
                f"{trace.name}: ctxfold, window {options.window:,}, compact_ratio {ratio:.2f}, {prices.name} prices",
                window=options.window,
                compact_ratio=ratio,
            )
        except PlotError as exc:
            print(f"ctxfold replay: --plot: {exc}", file=sys.stderr)
            return 1
        print(f"ctxfold replay: plot written to {written}", file=sys.stderr)
    if args.json:
        document = dataclasses.asdict(result)
        document["price_source"] = prices.source
        print(json.dumps(document, indent=2))
    else:
        print(report.single(result, prices.source))
    return 0
