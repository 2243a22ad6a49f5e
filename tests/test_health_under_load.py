"""`ctxfold serve` (a process of its own, as deployed) keeps answering health checks and other
sessions' Prepares while clients send it the largest requests its default limits allow: decoding,
checking, hashing and answering them never hold the event loop or the GIL for long, their CPU work
queues for a pool that leaves the loop a CPU and their token counts are made in a low-priority
process (`ctxfold.cpu`), large requests take turns and their bytes in progress are bounded
(`ctxfold.api.pacing`, `ctxfold.api.admission`), and the limits bound what gRPC copies on the loop.
The 100 ms goal is measured by `bench/availability.py`; these bounds are generous for a loaded CI
machine and far below what a frozen server takes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from builders import append, assistant, compact, create_session, prepare, result, user
from builders import call as call_message
from conftest import free_port, fresh_database
from ctxfold import cpu, loop_lag
from ctxfold.api.admission import Admission
from ctxfold.api.pacing import LARGE_BYTES, AnswerPacer, RequestPacer
from ctxfold.config import Settings
from ctxfold.engine import context as engine_context
from ctxfold.engine import estimator, folded_index
from ctxfold.engine import projection as engine_projection
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.service import folding as service_folding
from ctxfold.service import maintenance as service_maintenance
from ctxfold.summarizers import extractive
from ctxfold.telemetry import INSTRUMENTS
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_availability import probing, spaceless_text

MiB = 1 << 20
CLIENTS = 4
# With the code and limits of before (64 MiB requests, asyncio's default pool, no gc.freeze) health
# took 0.7 s here; a server tokenizing on its loop takes seconds.
HEALTH_WITHIN_SECONDS = 0.5
# A Prepare writes: on SQLite (one writer at a time) it can wait for the appends' 20 MiB inserts. A
# frozen server (contents tokenized on the event loop) takes several times this.
PREPARE_WITHIN_SECONDS = 5.0
OPTIONS = [("grpc.max_send_message_length", 64 * MiB), ("grpc.max_receive_message_length", 64 * MiB)]
# Room left in a request for everything but the contents (ids, roles, framing).
REQUEST_OVERHEAD_BYTES = 64 << 10
APPEND_METHOD = "/ctxfold.v1.ContextService/AppendMessages"


@asynccontextmanager
async def serving(database: str, log: Path) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """`ctxfold serve` on a free loopback port; yields its address and process once health answers
    SERVING."""
    address = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "ctxfold.cli", "serve", "--listen", address, "--database", database]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXFOLD_")}
    with log.open("wb") as out:
        process = subprocess.Popen([*command, "--summarizers", "{}"], env=env, stdout=out, stderr=out)  # noqa: ASYNC220
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(300):
                try:
                    if (await health.Check(health_pb2.HealthCheckRequest(), timeout=1)).status == 1:
                        break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"ctxfold serve did not start; its log is {log}")
        yield address, process
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 30)


def largest_append(session_id: str, settings: Settings, seed: int) -> bytes:
    """The wire form of the largest AppendMessages `settings` accept: user messages of the largest
    size (the last one smaller) filling a request."""
    room = settings.max_receive_message_bytes - REQUEST_OVERHEAD_BYTES
    sizes = [settings.max_message_bytes] * (room // settings.max_message_bytes)
    sizes += [room % settings.max_message_bytes] if room % settings.max_message_bytes else []
    messages = [
        pb.Message(role=pb.ROLE_USER, content=spaceless_text(size, seed * 100 + index))
        for index, size in enumerate(sizes)
    ]
    return pb.AppendMessagesRequest(session_id=session_id, messages=messages).SerializeToString()


async def test_health_and_another_sessions_prepare_answer_while_clients_send_the_largest_requests(
    backend: str, tmp_path: Path
) -> None:
    settings = Settings()
    async with serving(await fresh_database(backend, tmp_path), tmp_path / "serve.log") as (address, _):
        channels = [grpc.aio.insecure_channel(address, options=OPTIONS) for _ in range(CLIENTS)]
        stub = pb_grpc.ContextServiceStub(channels[0])
        big = pb.SessionConfig(context_window=100_000_000)
        sessions = [(await stub.CreateSession(pb.CreateSessionRequest(config=big))).session for _ in channels]
        other = (
            await stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(context_window=8000)))
        ).session
        # Serialized beforehand and sent as bytes: this process's own work stays off the probes' GIL.
        requests = [largest_append(s.id, settings, seed) for seed, s in enumerate(sessions)]
        turn = [pb.Message(role=pb.ROLE_USER, content="what changed?")]

        def check_health(probe_channel: grpc.Channel) -> None:
            answer = health_pb2_grpc.HealthStub(probe_channel).Check(health_pb2.HealthCheckRequest(), timeout=60)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

        def prepare_other(probe_channel: grpc.Channel) -> None:
            request = pb.PrepareRequest(session_id=other.id, append=turn)
            events = list(pb_grpc.ContextServiceStub(probe_channel).Prepare(request, timeout=60))
            assert events[-1].HasField("result")
            turn[:] = [pb.Message(role=pb.ROLE_ASSISTANT, content="nothing"), turn[-1]]

        async def append(channel: grpc.aio.Channel, request: bytes) -> bytes:
            answer: bytes = await channel.unary_unary(APPEND_METHOD)(request, timeout=600)
            return answer

        async with probing(address, check_health) as health, probing(address, prepare_other) as prepares:
            answers = await asyncio.gather(*(append(c, r) for c, r in zip(channels, requests, strict=True)))
        for channel in channels:
            await channel.close()
    for request, answer in zip(requests, answers, strict=True):
        sent = pb.AppendMessagesRequest.FromString(request).messages
        assert [m.content for m in pb.AppendMessagesResponse.FromString(answer).messages] == [m.content for m in sent]
    # How long the appends take depends on the machine, so nothing here requires them to be slow: every
    # probe that ran beside them (at least the first) answered within the bound.
    assert health and max(health) < HEALTH_WITHIN_SECONDS, sorted(health)[-5:]
    assert prepares and max(prepares) < PREPARE_WITHIN_SECONDS, prepares


async def test_large_work_runs_in_at_most_the_pools_workers_at_once_and_small_work_inline() -> None:
    """However many large requests arrive, their CPU work takes at most `cpu.WORKERS` threads (one
    fewer than the CPUs), so the event loop keeps a CPU; work on small inputs skips the thread hop."""
    running: list[str] = []
    most = 0
    guard = threading.Lock()

    def work() -> str:
        nonlocal most
        with guard:
            running.append(threading.current_thread().name)
            most = max(most, len(running))
        time.sleep(0.05)
        with guard:
            running.pop()
        return threading.current_thread().name

    names = await asyncio.gather(*(cpu.run(cpu.OFFLOAD_MIN_BYTES, work) for _ in range(4 * cpu.WORKERS + 2)))
    assert most == cpu.WORKERS == max(1, len(os.sched_getaffinity(0)) - 1)
    assert all(name.startswith("ctxfold-cpu") for name in names), set(names)
    assert await cpu.run(cpu.OFFLOAD_MIN_BYTES - 1, work) == threading.current_thread().name


async def test_a_large_append_is_checked_and_counted_off_the_event_loop(
    stub: pb_grpc.ContextServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking an append measures each text's UTF-8 size, a copy of every non-ASCII one (~10 ms per
    16 MiB), and making its stored forms counts its tokens: for a large append both run in the pool."""
    threads: dict[str, str] = {}

    def recorded(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            threads[name] = threading.current_thread().name
            return function(*args)

        return call

    for name in ("validate_new_messages", "stored_form"):
        monkeypatch.setattr(engine_context, name, recorded(name, getattr(engine_context, name)))
    config = pb.SessionConfig(context_window=1_000_000)
    session = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session
    content = "héllo wörld, 你好 " * (cpu.OFFLOAD_MIN_BYTES // 8)
    await stub.AppendMessages(
        pb.AppendMessagesRequest(session_id=session.id, messages=[pb.Message(role=pb.ROLE_USER, content=content)])
    )
    assert threads.keys() == {"validate_new_messages", "stored_form"}
    assert all(name.startswith("ctxfold-cpu") for name in threads.values()), threads


async def test_large_answers_go_out_a_loop_turn_apart_and_small_ones_at_once() -> None:
    """gRPC copies an answer in the step that returns it: a second large answer waits for the loop's
    next turn, so what became ready during the first copy (here `after a`) runs before it; a small
    answer does not wait at all."""
    pacer = AnswerPacer()
    order: list[str] = []

    async def answer(name: str, size: int) -> None:
        await pacer.turn(size)
        order.append(name)
        asyncio.get_running_loop().call_soon(order.append, f"after {name}")

    await asyncio.gather(answer("a", LARGE_BYTES), answer("b", LARGE_BYTES), answer("small", LARGE_BYTES - 1))
    assert order.index("small") < order.index("after a") < order.index("b"), order
    await asyncio.wait_for(pacer.turn(LARGE_BYTES), 1)  # the last turn was given back


async def test_large_requests_take_turns_in_order_of_arrival_by_bytes_and_small_ones_do_not_wait() -> None:
    """A large request is worked on once the large ones before it are done, up to one largest
    request's bytes at once; a later one never overtakes an earlier one that does not fit yet; a
    small request never waits; a cancelled waiter gives its place on, and a turn ended early
    (`Turn.end`, once or twice) lets the next one start."""
    capacity = 4 * LARGE_BYTES
    pacer = RequestPacer(capacity)
    order: list[str] = []
    gates = {name: asyncio.Event() for name in ("a", "b", "c", "d", "e")}

    async def request(name: str, size: int, end_early: bool = False) -> None:
        async with pacer.turn(size) as turn:
            order.append(f"{name} starts")
            if end_early:
                turn.end()
                turn.end()
            await gates[name].wait()
            order.append(f"{name} ends")

    async def settled() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    tasks = {"a": asyncio.create_task(request("a", 2 * LARGE_BYTES))}
    await settled()
    tasks["b"] = asyncio.create_task(request("b", 10 * capacity))  # larger than the capacity: alone
    await settled()
    tasks["c"] = asyncio.create_task(request("c", LARGE_BYTES))  # fits beside a, but b came first
    tasks["d"] = asyncio.create_task(request("d", LARGE_BYTES))
    await settled()
    async with pacer.turn(LARGE_BYTES - 1):
        order.append("small")
    assert order == ["a starts", "small"], order
    tasks["d"].cancel()  # its client went away while it waited
    gates["a"].set()
    await settled()
    assert order[-2:] == ["a ends", "b starts"], order
    gates["b"].set()
    await settled()
    assert order[-2:] == ["b ends", "c starts"], order
    tasks["e"] = asyncio.create_task(request("e", capacity, end_early=True))
    await settled()
    assert "e starts" not in order  # c still holds a part of the capacity
    gates["c"].set()
    await settled()
    assert order[-2:] == ["c ends", "e starts"], order
    # e ended its turn early: the next large request starts while e is still running.
    async with asyncio.timeout(1), pacer.turn(capacity):
        order.append("after e's turn")
    gates["e"].set()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert tasks["d"].cancelled() and "d starts" not in order
    async with asyncio.timeout(1), pacer.turn(capacity):  # everything was given back
        pass


async def test_an_admitted_large_request_holds_its_bytes_until_its_call_ends() -> None:
    """Large requests in progress hold at most `max_request_bytes` in all (one is admitted alone
    whatever its size); small requests are not counted."""
    admission = Admission(max_calls=10, max_calls_per_tenant=10, max_request_bytes=3 * LARGE_BYTES)
    with admission.admit("a", 2 * LARGE_BYTES):
        with pytest.raises(DomainError) as caught, admission.admit("b", 2 * LARGE_BYTES):
            pass
        error = caught.value
        assert (error.kind, error.reason) == (Kind.RESOURCE_EXHAUSTED, "SESSION_BUSY")
        assert error.metadata["scope"] == "server" and error.metadata["limit_bytes"] == str(3 * LARGE_BYTES)
        assert error.retry_after_seconds > 0
        with admission.admit("b", LARGE_BYTES), admission.admit("b", LARGE_BYTES - 1):
            pass
    # Alone, a request above the bound is admitted; beside it, none is.
    with admission.admit("b", 10 * LARGE_BYTES), pytest.raises(DomainError), admission.admit("a", LARGE_BYTES):
        pass
    with admission.admit("a", 3 * LARGE_BYTES):
        pass


def test_large_texts_are_counted_in_a_process_of_their_own_at_the_lowest_priority() -> None:
    """The counts are the tokenizer's own; the process runs at nice 19; a counting process that dies
    is replaced, and the count it did not answer is made anyway."""
    text = spaceless_text(cpu.OFFLOAD_MIN_BYTES * 4, 7)

    def counting_processes() -> list[multiprocessing.Process]:
        return [p for p in multiprocessing.active_children() if p.is_alive()]

    assert cpu.count_text(text) == estimator.count_text(text)
    (process,) = counting_processes()
    assert process.pid is not None and process.pid != os.getpid()
    assert os.getpriority(os.PRIO_PROCESS, process.pid) == cpu.COUNTING_NICE
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)
    assert cpu.count_text(text) == estimator.count_text(text)
    assert cpu.count_text(text + " more") == estimator.count_text(text + " more")
    (replacement,) = counting_processes()
    assert replacement.pid != process.pid
    assert cpu.count_text("short") == estimator.count_text("short")


def test_without_a_counting_process_texts_are_counted_in_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a process cannot be started (no /dev/shm for its queue's locks, say), every count is made
    in the calling thread, and after `MAX_FAILURES` attempts no more are made."""
    attempts = 0

    def no_processes(method: str) -> Any:
        nonlocal attempts
        attempts += 1
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(cpu.multiprocessing, "get_context", no_processes)
    counting = cpu._CountingProcess()
    text = spaceless_text(cpu.OFFLOAD_MIN_BYTES * 2, 3)
    for _ in range(counting.MAX_FAILURES + 2):
        assert counting.run(estimator.count_text, text) == estimator.count_text(text)
    assert attempts == counting.MAX_FAILURES


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # The command name (field 2) may hold spaces: the parent pid follows its closing bracket.
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(stat.parent.name))
    return found


def alive(pids: set[int]) -> dict[int, str]:
    """The command lines of those of `pids` still running."""
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return found


async def test_the_counting_process_of_a_server_killed_with_sigkill_exits(tmp_path: Path) -> None:
    """A server killed with SIGKILL cannot stop its counting process: that process sees it is orphaned
    and exits within a second, so crashes and restarts leave nothing behind."""
    async with serving(f"sqlite:///{tmp_path / 'ctxfold.db'}", tmp_path / "serve.log") as (_, process):
        helpers = alive(children(process.pid))
        counting = [pid for pid, command in helpers.items() if "spawn_main" in command]
        assert counting and os.getpriority(os.PRIO_PROCESS, counting[0]) == cpu.COUNTING_NICE, helpers
        process.kill()
        await asyncio.to_thread(process.wait, 10)
        for _ in range(100):
            if not alive(set(helpers)):
                break
            await asyncio.sleep(0.1)
        assert not alive(set(helpers))


def test_freed_large_buffers_are_kept_for_the_next_requests() -> None:
    """After `retain_large_buffers`, three 20 MiB buffers (what gRPC holds for one large request) are
    served again and again from memory touched once, at start, even after a burst of six made glibc
    give heap back, and also when another thread (gRPC's, the CPU pool's) allocates them; with glibc's
    own thresholds every round faults its pages in anew."""
    rounds = 5
    probe = f"""
import resource, sys, threading
from ctxfold import memory
if sys.argv[1] == "retained":
    assert memory.retain_large_buffers(80 << 20)
burst = [b"x" * (20 << 20) for _ in range(6)]
del burst
def allocate() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range({rounds}):
        buffers = [b"x" * (20 << 20) for _ in range(3)]
        del buffers
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
if sys.argv[2] == "thread":
    worker = threading.Thread(target=allocate)
    worker.start()
    worker.join()
else:
    allocate()
"""

    def faults(mode: str, where: str) -> int:
        done = subprocess.run([sys.executable, "-c", probe, mode, where], capture_output=True, text=True, check=True)
        return int(done.stdout)

    pages = rounds * 3 * (20 << 20) // os.sysconf("SC_PAGE_SIZE")
    for where in ("main", "thread"):
        assert faults("retained", where) < pages // 20, where
        assert faults("defaults", where) > pages // 2, where


async def test_a_held_event_loop_is_recorded_and_warned_of(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`loop_lag.watch` records how late its timer fired, and warns when the loop was held 100 ms or
    more."""
    recorded: list[float] = []
    monkeypatch.setattr(loop_lag, "INSTRUMENTS", dataclasses.replace(INSTRUMENTS, event_loop_lag=_Recorder(recorded)))
    watching = asyncio.create_task(loop_lag.watch(lambda: 1, interval=0.01))
    with caplog.at_level(logging.WARNING, logger="ctxfold.loop_lag"):
        await asyncio.sleep(0.05)
        time.sleep(0.15)  # noqa: ASYNC251 (holding the loop is the point)
        await asyncio.sleep(0.05)
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    assert len(recorded) > 5 and max(recorded) >= 0.14, recorded
    assert any(r.getMessage().startswith(loop_lag.HELD) for r in caplog.records), caplog.records


class _Recorder:
    def __init__(self, into: list[float]) -> None:
        self.into = into

    def record(self, value: float) -> None:
        self.into.append(value)


@pytest.mark.parametrize(
    ("lag", "before", "after", "level"),
    [(0.05, 3, 3, None), (0.12, 0, 0, logging.DEBUG), (0.12, 1, 0, logging.WARNING), (0.12, 0, 2, logging.WARNING)],
)
def test_a_hold_is_a_warning_only_when_a_call_waited(lag: float, before: int, after: int, level: int | None) -> None:
    """An idle server whose loop another process held 120 ms logs that at DEBUG: nobody waited."""
    assert loop_lag.log_level(lag, loop_lag.WARN_SECONDS, before, after) == level


LONG_VIEW_MESSAGES = 1200


async def test_a_fold_of_many_short_messages_works_off_the_event_loop(
    stub: pb_grpc.ContextServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's steps over a view cost microseconds per message whatever their text: with a view of many
    short messages, making an append's messages (counts), loading it, appending, deciding, planning,
    recording, summarizing and accepting a fold run in the pool (a fold of 120,000 held the loop for seconds),
    while an append of two messages to a short session's view stays on the loop."""
    calls: list[tuple[str, int, str]] = []

    def recorded(module: Any, name: str, size: Callable[..., int]) -> None:
        function = getattr(module, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, size(*args), threading.current_thread().name))
            return function(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    recorded(
        engine_projection, "build_view", lambda config, tokens, checkpoint, kept, after, *_: len(kept) + len(after)
    )
    recorded(engine_context, "append", lambda context, *_: len(context.projection.messages))
    recorded(engine_context, "made", lambda messages, *_: len(messages))
    recorded(service_maintenance, "decide", lambda snapshot, _: len(snapshot.projection.messages))
    recorded(service_folding, "plan_pass", lambda projection, *_: len(projection.messages))
    recorded(service_folding, "record_pass", lambda projection, *_: len(projection.messages))
    recorded(service_folding, "accept", lambda projection, *_: len(projection.messages))
    recorded(extractive, "briefing", lambda request: len(request.folded))
    session = await create_session(stub, context_window=12_000)
    turns = [
        (user(f"do step {n} in src/module_{n}.py"), assistant(f"done {n}")) for n in range(LONG_VIEW_MESSAGES // 2)
    ]
    history = [message for turn in turns for message in turn]
    for start in range(0, len(history), 600):
        await append(stub, session.id, *history[start : start + 600])
    assert (await prepare(stub, session.id)).result.action == pb.ACTION_FOLDED
    long = [(name, size, thread) for name, size, thread in calls if size >= LONG_VIEW_MESSAGES // 2]
    assert {name for name, _, _ in long} == {
        "made", "build_view", "append", "decide", "plan_pass", "record_pass", "accept", "briefing"
    }  # fmt: skip
    assert all(thread.startswith("ctxfold-cpu") for _, _, thread in long), long

    calls.clear()
    short = await create_session(stub)
    await append(stub, short.id, user("task"))
    await prepare(stub, short.id, assistant("on it"), user("go on"))
    on_loop = [threading.current_thread().name] * 2
    assert [thread for name, _, thread in calls if name == "append"] == on_loop
    assert [thread for name, _, thread in calls if name == "made"] == on_loop


async def test_a_fold_of_a_few_messages_with_megabytes_of_text_reads_them_off_the_event_loop(
    stub: pb_grpc.ContextServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recording a fold reads every folded text (the artifacts of a call's arguments) and the extractive summarizer
    every assistant text: with large texts both run in the pool however few the messages are (a fold of one call
    with a 300,000-character command held the loop for seconds)."""
    threads: dict[str, str] = {}
    for module, name in ((service_folding, "record_pass"), (extractive, "briefing")):
        function = getattr(module, name)

        def call(*args: Any, function: Callable[..., Any] = function, name: str = name) -> Any:
            threads[name] = threading.current_thread().name
            return function(*args)

        monkeypatch.setattr(module, name, call)
    session = await create_session(stub, context_window=1_000_000)
    command = "echo '" + "word " * 60_000 + "'"
    await prepare(stub, session.id, user("the task"), assistant("I will say it at length. " * 3_000))
    await prepare(stub, session.id, call_message("c1", "bash", json.dumps({"command": command})), result("c1", "ok"))
    await prepare(stub, session.id, user("next"), assistant("done"))
    assert (await compact(stub, session.id)).result.action == pb.ACTION_FOLDED
    assert threads.keys() == {"record_pass", "briefing"}
    assert all(name.startswith("ctxfold-cpu") for name in threads.values()), threads


async def test_a_fold_of_a_small_view_writes_a_long_sessions_folded_results_index_off_the_event_loop(
    stub: pb_grpc.ContextServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folded-results index lists every result the session ever folded: a fold of a view of a few messages
    renders it in the pool when it is large (a session of 100,000 folded results held the loop 0.4 s per fold)."""
    threads: list[str] = []
    render = folded_index.render

    def rendering(index: folded_index.FoldedIndex) -> str:
        threads.append(threading.current_thread().name)
        return render(index)

    monkeypatch.setattr(folded_index, "render", rendering)
    session = await create_session(stub, context_window=1_000_000)
    pairs = [
        (call_message(f"c{i}", "bash", json.dumps({"command": f"ls dir{i}"})), result(f"c{i}", "ok"))
        for i in range(400)
    ]
    await append(stub, session.id, user("the task"), *itertools.chain.from_iterable(pairs))
    await prepare(stub, session.id, user("next"), assistant("done"))
    assert (await compact(stub, session.id)).result.action == pb.ACTION_FOLDED
    threads.clear()
    await prepare(stub, session.id, user("more"), assistant("I looked at every listing at length. " * 300))
    await prepare(stub, session.id, user("and more"), assistant("done"))
    assert (await compact(stub, session.id)).result.action == pb.ACTION_FOLDED
    assert threads and all(name.startswith("ctxfold-cpu") for name in threads), threads


async def test_a_session_acting_in_text_is_maintained_off_the_event_loop(
    stub: pb_grpc.ContextServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step over the view of a session that may act in text scans its assistant texts for fenced commands: with
    megabytes of them its steps run in the pool however few its messages are (a view of five messages held the loop
    0.1 s per step, scanning two 3.6 MB replies)."""
    threads: list[str] = []
    decide = service_maintenance.decide

    def deciding(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return decide(*args)

    monkeypatch.setattr(service_maintenance, "decide", deciding)
    session = await create_session(stub, context_window=2_000_000)
    fenced = "I listed it at length. " * 4_000 + "\n```\nls -la\n```"
    await prepare(stub, session.id, user("the task"), assistant(fenced), user("file1"), assistant(fenced), user("a"))
    threads.clear()
    await compact(stub, session.id)
    assert threads and all(name.startswith("ctxfold-cpu") for name in threads), threads
