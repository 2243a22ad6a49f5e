#!/usr/bin/env python3
"""The gateway's overhead against calling the same fake upstream directly, side by side in one run
(issue 23).

Every server runs in its own process: `ctxfold serve` on a fresh SQLite file, the fake upstream
(tests/fake_upstream.py, answering "ok" in each API), `ctxfold gateway` with ctxfold
behind it, and `ctxfold gateway --mode pass_through`: the same HTTP stack (aiohttp server and client,
the same handlers) forwarding every request unchanged. One client process drives them with
pre-serialized requests, so the three modes differ only in what is in between:

  direct        client -> fake upstream
  pass_through  client -> gateway (ctxfold off) -> fake upstream
  ctxfold       client -> gateway -> (ContextService: reconcile, append, Prepare) -> fake upstream

  latency     per round and mode, one conversation whose history is ~`--history-tokens` tokens;
              `--calls` sequential calls, each adding the previous answer and a 1 kB user message.
              p50/p99 over all rounds, what each gateway adds to direct, and the CPU time per call of
              every process on the way (`cpu ms`: client, gateway, ctxfold, upstream; /proc/PID/stat):
              on a machine with fewer cores than busy processes, latency follows it.
  ttfb        the same, streamed: time to the first byte of the answer.
  throughput  `--concurrency` conversations of ~`--throughput-tokens` tokens, a closed loop for
              `--seconds`: requests/s per mode (medians over rounds).
  stall       one request of `--stall-messages` small messages (a long history arriving at once, or
              a hostile one) sent to the ctxfold gateway while another client asks it for /v1/models
              every 10 ms: how long that request took, and the longest wait of the others meanwhile
              (the gateway parses, reconciles and rewrites a large request in its CPU pool).
  memory      `--memory-sessions` conversations of ~`--history-tokens` tokens sent to the ctxfold gateway,
              three calls each (the history appended, then two turns: the gateway keeps each session's
              last request and the SDK's view of it): its RSS every tenth of them, against its
              kept-bytes budget (`MAX_KEPT_BYTES`). It levels off once the sessions fill the budget.
  saving      a recorded agent trace replayed through the gateway at a `--replay-window` window: tokens
              the agent sent against tokens the upstream received, and both billed with `ctxfold
              replay`'s prompt-cache simulator and price sheet (GPT-5, OpenAI's cache rules).

The first call of each conversation (which creates the session and appends the whole history) is a
warm-up and not timed. Rounds interleave the modes and alternate their order. The goals of issue 23
are printed with PASS or MISS: added p50 <= 2 ms, added p99 <= 10 ms, time to first byte within 2 ms
of direct, ctxfold requests/s >= 50 % of pass_through's.

The agent speaks Chat Completions unless `--api responses` or `--api anthropic` (the same history as
that API's items or blocks; the saving is replayed for Chat only).

    .venv/bin/python bench/gateway.py [--rounds 3] [--calls 40] [--seconds 4] [--api chat] [--json PATH]
    .venv/bin/python bench/gateway.py --quick      # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import benchlib as bl
import orjson

sys.path.insert(0, str(bl.REPO / "tests"))
from ctxfold.engine import estimator
from ctxfold.gateway.app import start_gateway
from ctxfold.gateway.contexts import MAX_KEPT_BYTES
from ctxfold.gateway.settings import GatewaySettings
from ctxfold.replay import trace as replay_trace
from ctxfold.replay.prices import BUILT_IN
from ctxfold.replay.simulator import Provider, answer_tokens, cache_model
from fake_upstream import CHAT, Call, FakeUpstream, Reply

MODES = ("direct", "pass_through", "ctxfold")
NEW_MESSAGE_BYTES = 1024
# A window far above every history, so that latency and throughput calls never fold.
NO_FOLD_WINDOW = 10_000_000
PRICE_SHEET = "gpt-5"
GOALS = {"added_p50_ms": 2.0, "added_p99_ms": 10.0, "ttfb_added_ms": 2.0, "throughput_ratio": 0.5}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}


@dataclass(frozen=True)
class Options:
    rounds: int
    calls: int
    seconds: float
    concurrency: int
    history_tokens: int
    throughput_tokens: int
    replay_window: int
    trace: Path
    api: str = "chat"  # the provider API the agent speaks (`PATHS`); the saving is replayed for "chat" only
    stall_messages: int = 50_000  # messages of the stall request
    memory_sessions: int = 300  # conversations of the memory phase


@dataclass
class Endpoint:
    mode: str
    url: str  # the base URL the client posts /v1/chat/completions to
    pids: tuple[int, ...]  # the processes that serve it (gateway, ctxfold, upstream): their CPU is its cost


def cpu_seconds(pids: tuple[int, ...]) -> float:
    """CPU time so far of these processes (in clock ticks: time enough calls) and of this one (the client)."""
    return sum(bl.cpu_seconds(pid) for pid in pids) + time.process_time()


def history(tokens: int, tag: str) -> list[dict[str, Any]]:
    """A coding-agent history of about `tokens` tokens: a task, then tool calls with ~4 kB results."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": f"Conversation {tag}: find why the test suite fails."},
    ]
    step = 0
    while sum(len(m.get("content") or "") for m in out) < tokens * 4:
        call_id = f"call_{tag}_{step}"
        arguments = f'{{"cmd": "pytest -k t{step}"}}'
        call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        lines = [f"tests/test_{step}.py::test_{n} PASSED [{n}%] took {n * 7 % 13}.{n % 10}s" for n in range(70)]
        out.append({"role": "tool", "tool_call_id": call_id, "content": "\n".join(lines)})
        step += 1
    return out


def responses_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The Chat history as an OpenAI Responses request: the system prompt as instructions, calls and
    results as items."""
    items: list[dict[str, Any]] = []
    for m in messages[1:]:
        if m["role"] == "user":
            items.append({"role": "user", "content": m["content"]})
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        elif m.get("tool_calls"):
            items += [{"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                       "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]  # fmt: skip
        else:
            text = [{"type": "output_text", "text": m["content"]}]
            items.append({"type": "message", "role": "assistant", "content": text})
    tools = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]
    return {"model": "gpt-4.1", "instructions": messages[0]["content"], "input": items, "tools": tools}


def anthropic_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The Chat history as an Anthropic Messages request as Claude Code writes one: every content a
    list of blocks (calls as tool_use blocks, results as tool_result blocks of user turns), cache
    breakpoints on the system prompt and on the last turn (moved there each time)."""
    out: list[dict[str, Any]] = []
    for m in messages[1:]:
        if m["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            out.append({"role": "user", "content": [result]})
        elif m.get("tool_calls"):
            uses = [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                     "input": json.loads(c["function"]["arguments"])} for c in m["tool_calls"]]  # fmt: skip
            out.append({"role": "assistant", "content": uses})
        else:
            out.append({"role": m["role"], "content": [{"type": "text", "text": m["content"]}]})
    *blocks, last = out[-1]["content"]
    out[-1] = {**out[-1], "content": [*blocks, {**last, "cache_control": {"type": "ephemeral"}}]}
    system = [{"type": "text", "text": messages[0]["content"], "cache_control": {"type": "ephemeral"}}]
    tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": system, "messages": out, "tools": tools}


def request_body(api: str, messages: list[dict[str, Any]], stream: bool) -> bytes:
    if api == "responses":
        body = responses_body(messages)
    elif api == "anthropic":
        body = anthropic_body(messages)
    else:
        body = {"model": "gpt-4.1", "messages": messages, "tools": TOOLS}
    return orjson.dumps({**body, "stream": True} if stream else body)


def new_message(number: int) -> dict[str, Any]:
    text = f"Step {number}: " + ("please continue with the next failing test and report. " * 20)
    return {"role": "user", "content": text[:NEW_MESSAGE_BYTES]}


class Conversation:
    """One agent conversation: its history grows by the previous answer and a new message per call."""

    def __init__(self, tokens: int, tag: str, api: str, stream: bool = False):
        self.messages = history(tokens, tag)
        self.tag = tag
        self.api = api
        self.stream = stream
        self.calls = 0

    def next_body(self) -> bytes:
        if self.calls:
            self.messages.append({"role": "assistant", "content": "ok"})
        self.messages.append(new_message(self.calls))
        self.calls += 1
        return request_body(self.api, self.messages, self.stream)

    @property
    def headers(self) -> dict[str, str]:
        key = {"x-api-key": "sk-bench", "anthropic-version": "2023-06-01"} if self.api == "anthropic" else {
            "Authorization": "Bearer sk-bench"}  # fmt: skip
        return {**key, "Content-Type": "application/json", "x-ctxfold-session": self.tag,
                "x-ctxfold-context-window": str(NO_FOLD_WINDOW)}  # fmt: skip


async def call(http: aiohttp.ClientSession, endpoint: Endpoint, conversation: Conversation) -> tuple[float, float]:
    """(seconds to the whole answer, seconds to its first byte)."""
    body = conversation.next_body()
    started = time.perf_counter()
    url = f"{endpoint.url}{PATHS[conversation.api]}"
    async with http.post(url, data=body, headers=conversation.headers) as answer:
        await answer.content.readany()
        first = time.perf_counter() - started
        await answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{endpoint.mode}: HTTP {answer.status}: {await answer.text()}")
    return time.perf_counter() - started, first


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def measure_latency(
    http: aiohttp.ClientSession, endpoints: list[Endpoint], options: Options, round_number: int, stream: bool
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per mode, the seconds of each timed call (to the whole answer; to the first byte when streamed), and
    the CPU seconds per call of every process on its way (client, gateway, ctxfold, upstream)."""
    out: dict[str, list[float]] = {}
    cpu: dict[str, float] = {}
    order = endpoints if round_number % 2 == 0 else endpoints[::-1]
    for endpoint in order:
        kind = "ttfb" if stream else "latency"
        tag = f"{kind}-{endpoint.mode}-{round_number}"
        conversation = Conversation(options.history_tokens, tag, options.api, stream)
        await call(http, endpoint, conversation)  # warm-up: the session is created, the history appended
        times = []
        cpu_before = cpu_seconds(endpoint.pids)
        for _ in range(options.calls):
            whole, first = await call(http, endpoint, conversation)
            times.append(first if stream else whole)
        cpu[endpoint.mode] = (cpu_seconds(endpoint.pids) - cpu_before) / options.calls
        out[endpoint.mode] = times
    return out, cpu


async def measure_throughput(
    http: aiohttp.ClientSession, endpoints: list[Endpoint], options: Options, round_number: int
) -> dict[str, float]:
    out: dict[str, float] = {}
    order = endpoints if round_number % 2 == 0 else endpoints[::-1]
    for endpoint in order:
        conversations = [
            Conversation(options.throughput_tokens, f"rps-{endpoint.mode}-{round_number}-{n}", options.api)
            for n in range(options.concurrency)
        ]
        await asyncio.gather(*(call(http, endpoint, c) for c in conversations))  # warm-up
        deadline = time.perf_counter() + options.seconds
        started = time.perf_counter()
        done = await asyncio.gather(*(closed_loop(http, endpoint, c, deadline) for c in conversations))
        out[endpoint.mode] = sum(done) / (time.perf_counter() - started)
    return out


async def closed_loop(
    http: aiohttp.ClientSession, endpoint: Endpoint, conversation: Conversation, deadline: float
) -> int:
    """Calls one after the other until `deadline`; how many."""
    done = 0
    while time.perf_counter() < deadline:
        await call(http, endpoint, conversation)
        done += 1
    return done


async def measure_stall(http: aiohttp.ClientSession, url: str, messages: int) -> dict[str, Any]:
    """One request of `messages` short messages to the gateway at `url`, timed, while /v1/models is
    asked every 10 ms: the seconds of each of those answers."""
    history = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"message {n}"} for n in range(messages)]
    body = orjson.dumps({"model": "gpt-4.1", "messages": [*history, new_message(0)]})
    headers = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json",
               "x-ctxfold-session": "stall", "x-ctxfold-context-window": str(NO_FOLD_WINDOW)}  # fmt: skip
    waits: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            async with http.get(f"{url}/v1/models", headers={"Authorization": "Bearer sk-bench"}) as answer:
                await answer.read()
            waits.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)

    probing = asyncio.create_task(probe())
    await asyncio.sleep(0.2)
    started = time.perf_counter()
    async with http.post(f"{url}{PATHS['chat']}", data=body, headers=headers) as answer:
        await answer.read()
        if answer.status != 200 or "x-ctxfold-warning" in answer.headers:
            raise RuntimeError(f"stall: HTTP {answer.status} {answer.headers.get('x-ctxfold-warning', '')}")
    took = time.perf_counter() - started
    done.set()
    await probing
    return {"messages": messages, "request_bytes": len(body), "seconds": took,
            "probe_p50_ms": percentile(waits, 0.5) * 1000, "probe_max_ms": max(waits) * 1000,
            "probes": len(waits)}  # fmt: skip


async def measure_memory(http: aiohttp.ClientSession, endpoint: Endpoint, options: Options) -> dict[str, Any]:
    """The gateway's RSS (MiB) before and after every tenth of `options.memory_sessions` conversations of
    three calls each."""
    gateway_pid, sessions = endpoint.pids[0], options.memory_sessions
    samples = [(0, bl.rss_kib(gateway_pid) >> 10)]
    for number in range(sessions):
        conversation = Conversation(options.history_tokens, f"memory-{number}", options.api)
        for _ in range(3):
            await call(http, endpoint, conversation)
        if (number + 1) % max(1, sessions // 10) == 0 or number + 1 == sessions:
            samples.append((number + 1, bl.rss_kib(gateway_pid) >> 10))
    return {"sessions": sessions, "history_tokens": options.history_tokens, "rss_mib": samples,
            "kept_bytes_budget_mib": MAX_KEPT_BYTES >> 20}  # fmt: skip


# ---- the saving over a recorded trace -------------------------------------------------------------


def chat_message(message: replay_trace.Msg) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
    return out


def as_msgs(messages: list[dict[str, Any]]) -> list[replay_trace.Msg]:
    return [replay_trace._message(m, i) for i, m in enumerate(messages)]


async def measure_saving(server_address: str, options: Options) -> dict[str, Any]:
    """Replays the trace through an in-process gateway and fake upstream (tokens, not time, count here)."""
    trace = replay_trace.parse_trace(options.trace.name, options.trace.read_text())
    turns, _ = replay_trace.turns(trace)
    upstream = FakeUpstream()
    await upstream.start()
    upstream.reply(CHAT, *[
        Reply(text=t.answer.content, calls=tuple(Call(c.id, c.name, c.arguments) for c in t.answer.tool_calls))
        for t in turns
    ])  # fmt: skip
    settings = GatewaySettings(listen="127.0.0.1:0", server=server_address, openai_base_url=upstream.base_url,
                               max_read_rounds=0)  # fmt: skip
    gateway = await start_gateway(settings)
    tools_json = trace.tools_json
    prices = BUILT_IN[PRICE_SHEET]
    direct, through = Provider(cache_model("openai"), prices), Provider(cache_model("openai"), prices)
    sent_tokens = upstream_tokens = 0
    direct_cost = through_cost = 0.0
    folds = 0
    messages: list[dict[str, Any]] = [{"role": "system", "content": trace.system_prompt}]
    try:
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": "Bearer sk-bench", "x-ctxfold-session": f"replay-{time.time_ns()}",
                       "x-ctxfold-context-window": str(options.replay_window)}  # fmt: skip
            for turn in turns:
                # a turn's messages start with the previous answer, which is in `messages` already
                messages += [chat_message(m) for m in turn.append if m.role != "assistant"]
                body = {"model": "gpt-4.1", "messages": messages, "tools": json.loads(tools_json)}
                async with http.post(
                    f"{gateway_url(gateway.port)}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    await r.read()
                    folds += r.headers.get("x-ctxfold-action") == "folded"
                output = answer_tokens(turn.answer)
                agent_view = as_msgs(messages)
                upstream_view = as_msgs(upstream.last(CHAT).body["messages"])
                sent_tokens += sum(estimator.count_text(orjson.dumps(m).decode()) for m in messages)
                upstream_tokens += sum(
                    estimator.count_text(orjson.dumps(m).decode()) for m in upstream.last(CHAT).body["messages"]
                )
                direct_cost += direct.send("agent", tools_json, agent_view, output).cost
                through_cost += through.send("agent", tools_json, upstream_view, output).cost
                direct.advance(10.0)
                through.advance(10.0)
                messages.append(chat_message(turn.answer))
    finally:
        await gateway.stop()
        await upstream.stop()
    return {
        "trace": options.trace.name,
        "model_calls": len(turns),
        "folds": folds,
        "window": options.replay_window,
        "agent_tokens": sent_tokens,
        "upstream_tokens": upstream_tokens,
        "token_saving": 1 - upstream_tokens / sent_tokens,
        "price_sheet": PRICE_SHEET,
        "direct_cost": direct_cost,
        "gateway_cost": through_cost,
        "cost_saving": 1 - through_cost / direct_cost,
    }


def gateway_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


# ---- processes ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def http_process(name: str, command: list[str], port: int, log_path: Path) -> AsyncIterator[tuple[str, int]]:
    """A process serving HTTP on `port`, once it answers: its URL and pid; stopped afterwards."""
    with log_path.open("ab") as out:
        popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=bl.ctxfold_env())  # noqa: ASYNC220
    url = gateway_url(port)
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(300):
                if popen.poll() is not None:
                    raise RuntimeError(f"{name} exited; its log is {log_path}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{url}/v1/models", headers={"Authorization": "Bearer sk-bench"}):
                        break
                await asyncio.sleep(0.1)
        yield url, popen.pid
    finally:
        await bl.stop_process(popen)


async def run(options: Options) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ctxfold-gateway-bench-") as tmp_name:
        tmp = Path(tmp_name)
        database = f"sqlite:///{tmp / 'ctxfold.db'}"
        upstream_port, through_port, gateway_port = bl.free_port(), bl.free_port(), bl.free_port()
        fake = [sys.executable, str(bl.REPO / "tests" / "fake_upstream.py"), str(upstream_port)]
        async with contextlib.AsyncExitStack() as stack:
            server = await stack.enter_async_context(bl.serve_process(database, tmp / "server.log", *bl.QUIET))
            upstream_url, upstream_pid = await stack.enter_async_context(
                http_process("upstream", fake, upstream_port, tmp / "up.log")
            )

            def gateway(mode: str, port: int) -> list[str]:
                return [*bl.ctxfold_command(), "gateway", "--listen", f"127.0.0.1:{port}", "--server", server.address,
                        "--openai-base-url", upstream_url, "--anthropic-base-url", upstream_url, "--mode", mode,
                        "--log-level", "WARNING"]  # fmt: skip

            through_url, through_pid = await stack.enter_async_context(
                http_process("pass_through", gateway("pass_through", through_port), through_port, tmp / "pt.log")
            )
            ctxfold_url, ctxfold_pid = await stack.enter_async_context(
                http_process("ctxfold", gateway("ctxfold", gateway_port), gateway_port, tmp / "gw.log")
            )
            endpoints = [Endpoint("direct", upstream_url, (upstream_pid,)),
                         Endpoint("pass_through", through_url, (through_pid, upstream_pid)),
                         Endpoint("ctxfold", ctxfold_url, (ctxfold_pid, server.pid, upstream_pid))]  # fmt: skip
            latency: dict[str, list[float]] = {m: [] for m in MODES}
            cpu: dict[str, list[float]] = {m: [] for m in MODES}
            ttfb: dict[str, list[float]] = {m: [] for m in MODES}
            throughput: dict[str, list[float]] = {m: [] for m in MODES}
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as http:
                for number in range(options.rounds):
                    bl.log(f"round {number + 1}/{options.rounds}: latency")
                    times, cpu_per_call = await measure_latency(http, endpoints, options, number, False)
                    for mode in MODES:
                        latency[mode] += times[mode]
                        cpu[mode].append(cpu_per_call[mode])
                    bl.log(f"round {number + 1}/{options.rounds}: time to first byte")
                    times_to_first, _ = await measure_latency(http, endpoints, options, number, True)
                    for mode in MODES:
                        ttfb[mode] += times_to_first[mode]
                    bl.log(f"round {number + 1}/{options.rounds}: throughput")
                    for mode, rate in (await measure_throughput(http, endpoints, options, number)).items():
                        throughput[mode].append(rate)
                bl.log(f"stall: one request of {options.stall_messages:,} messages")
                stall = await measure_stall(http, ctxfold_url, options.stall_messages)
                bl.log(f"memory: {options.memory_sessions} conversations")
                memory = await measure_memory(http, endpoints[-1], options)
            saving = None
            if options.api == "chat":
                bl.log("saving: replaying the trace")
                saving = await measure_saving(server.address, options)
    return summarize(options, latency, ttfb, cpu, throughput, stall, memory, saving)


def summarize(
    options: Options,
    latency: dict[str, list[float]],
    ttfb: dict[str, list[float]],
    cpu: dict[str, list[float]],
    throughput: dict[str, list[float]],
    stall: dict[str, Any],
    memory: dict[str, Any],
    saving: dict[str, Any] | None,
) -> dict[str, Any]:
    def ms(values: list[float], share: float) -> float:
        return percentile(values, share) * 1000

    table = {
        mode: {
            "p50_ms": ms(latency[mode], 0.5),
            "p99_ms": ms(latency[mode], 0.99),
            "ttfb_p50_ms": ms(ttfb[mode], 0.5),
            "cpu_ms_per_call": statistics.median(cpu[mode]) * 1000,
            "requests_per_s": statistics.median(throughput[mode]),
        }
        for mode in MODES
    }
    direct = table["direct"]
    added = {
        mode: {
            "added_p50_ms": table[mode]["p50_ms"] - direct["p50_ms"],
            "added_p99_ms": table[mode]["p99_ms"] - direct["p99_ms"],
            "ttfb_added_ms": table[mode]["ttfb_p50_ms"] - direct["ttfb_p50_ms"],
        }
        for mode in ("pass_through", "ctxfold")
    }
    ratio = table["ctxfold"]["requests_per_s"] / table["pass_through"]["requests_per_s"]
    goals = {
        "added_p50_ms": added["ctxfold"]["added_p50_ms"] <= GOALS["added_p50_ms"],
        "added_p99_ms": added["ctxfold"]["added_p99_ms"] <= GOALS["added_p99_ms"],
        "ttfb_added_ms": added["ctxfold"]["ttfb_added_ms"] <= GOALS["ttfb_added_ms"],
        "throughput_ratio": ratio >= GOALS["throughput_ratio"],
    }
    return {"options": {**asdict(options), "trace": str(options.trace)}, "modes": table, "added": added,
            "throughput_ratio": ratio, "goals": goals, "stall": stall, "memory": memory, "saving": saving}  # fmt: skip


def render(result: dict[str, Any]) -> str:
    options, table, added = result["options"], result["modes"], result["added"]
    lines = [
        f"gateway overhead ({options['api']}): ~{options['history_tokens']:,}-token history + 1 kB message, "
        f"{options['calls']} calls x "
        f"{options['rounds']} rounds; throughput {options['concurrency']} in flight at "
        f"~{options['throughput_tokens']:,} tokens",
        f"{'mode':<14}{'p50 ms':>10}{'p99 ms':>10}{'ttfb p50':>10}{'req/s':>10}{'+p50':>9}{'+p99':>9}{'+ttfb':>9}"
        f"{'cpu ms':>9}",
    ]
    for mode in MODES:
        row = table[mode]
        extra = added.get(mode, {"added_p50_ms": 0.0, "added_p99_ms": 0.0, "ttfb_added_ms": 0.0})
        lines.append(
            f"{mode:<14}{row['p50_ms']:>10.2f}{row['p99_ms']:>10.2f}{row['ttfb_p50_ms']:>10.2f}"
            f"{row['requests_per_s']:>10.1f}{extra['added_p50_ms']:>9.2f}{extra['added_p99_ms']:>9.2f}"
            f"{extra['ttfb_added_ms']:>9.2f}{row['cpu_ms_per_call']:>9.2f}"
        )
    goals = result["goals"]

    def mark(name: str) -> str:
        return "PASS" if goals[name] else "MISS"

    lines += [
        f"goal added p50 <= 2 ms: {added['ctxfold']['added_p50_ms']:.2f} ms {mark('added_p50_ms')}",
        f"goal added p99 <= 10 ms: {added['ctxfold']['added_p99_ms']:.2f} ms {mark('added_p99_ms')}",
        f"goal ttfb within 2 ms of direct: +{added['ctxfold']['ttfb_added_ms']:.2f} ms {mark('ttfb_added_ms')}",
        f"goal req/s >= 50 % of pass_through: {result['throughput_ratio']:.0%} {mark('throughput_ratio')}",
    ]
    stall = result["stall"]
    lines.append(
        f"stall: one request of {stall['messages']:,} messages ({stall['request_bytes'] / 1e6:.1f} MB) took "
        f"{stall['seconds']:.2f} s; /v1/models meanwhile p50 {stall['probe_p50_ms']:.1f} ms, longest "
        f"{stall['probe_max_ms']:.0f} ms ({stall['probes']} probes)"
    )
    memory = result["memory"]
    lines.append(
        f"memory: gateway RSS {' / '.join(str(rss) for _, rss in memory['rss_mib'])} MiB after "
        f"{' / '.join(str(n) for n, _ in memory['rss_mib'])} conversations of ~{memory['history_tokens']:,} tokens "
        f"(kept-bytes budget {memory['kept_bytes_budget_mib']} MiB)"
    )
    saving = result["saving"]
    if saving is None:
        return "\n".join([*lines, "saving: replayed with --api chat only"])
    lines.append(
        f"saving over {saving['trace']} ({saving['model_calls']} model calls, window {saving['window']:,}, "
        f"{saving['folds']} folds): {saving['agent_tokens']:,} tokens sent by the agent, {saving['upstream_tokens']:,} "
        f"upstream ({saving['token_saving']:.0%} fewer); {saving['price_sheet']} with OpenAI's cache: "
        f"${saving['direct_cost']:.4f} direct, ${saving['gateway_cost']:.4f} through ctxfold "
        f"({saving['cost_saving']:.0%} less)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=bl.positive_int, default=3)
    parser.add_argument("--calls", type=bl.positive_int, default=40, help="timed sequential calls per mode and round")
    parser.add_argument("--seconds", type=bl.positive_float, default=4.0, help="throughput window per mode")
    parser.add_argument("--concurrency", type=bl.positive_int, default=16)
    parser.add_argument("--history-tokens", type=bl.positive_int, default=100_000)
    parser.add_argument("--throughput-tokens", type=bl.positive_int, default=100_000)
    parser.add_argument("--replay-window", type=bl.positive_int, default=16_000)
    parser.add_argument("--trace", type=Path, default=bl.DEFAULT_TRACES / "openhands-django-11149.json")
    parser.add_argument("--api", choices=sorted(PATHS), default="chat", help="the provider API the agent speaks")
    parser.add_argument("--stall-messages", type=bl.positive_int, default=50_000, help="messages of the stall request")
    parser.add_argument("--memory-sessions", type=bl.positive_int, default=300, help="conversations, memory phase")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON to PATH")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes, one round")
    args = parser.parse_args()
    options = Options(args.rounds, args.calls, args.seconds, args.concurrency, args.history_tokens,
                      args.throughput_tokens, args.replay_window, args.trace, args.api,
                      args.stall_messages, args.memory_sessions)  # fmt: skip
    if args.quick:
        options = Options(1, 3, 0.5, 4, 4000, 2000, args.replay_window, args.trace, args.api, 2000, 3)
    result = asyncio.run(run(options))
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
