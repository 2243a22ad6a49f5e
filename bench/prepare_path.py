#!/usr/bin/env python3
"""Which modules of the shell one append-only Prepare passes through (issue 22's goal: at most 6, never
returning to one it has left), traced with a profile hook on an in-process server over SQLite.

A session is warmed with three delta Prepares (its context cached), then one more is traced. A *stop* is a
call from one module into another (the engine's are listed apart), the caller being the nearest frame of
ctxfold's (a module entering itself through `contextlib`'s `async with` is no stop); a *return* is a stop in
a module the Prepare entered before (a module calling back into its caller, or a helper entered twice), not
the unwinding of a call, nor a suspended coroutine resuming (the hook sees those as calls too, and skips them).

The goal counts the use case behind the gRPC door: the stops made inside the door's call into service/
(service/, store/ and the top-level modules). The door (api/) gives each cross-cutting concern a file of its
own (tracing, auth, admission, pacing, validation, conversion: issue 22, item 3), and its own work outside
that call (decoding the request and encoding the answer, in the CPU pool when large: `cpu.run`) is the
door's; the issue's "11 today" counted the modules behind it. The door is printed too, with its own stops and
returns.

    .venv/bin/python bench/prepare_path.py [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl

from ctxfold.server import start
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

PACKAGE = str(bl.REPO / "server" / "ctxfold") + "/"
SHELL_PACKAGES = ("service/", "store/", "api/")
GOAL_MODULES = 6


def module_of(filename: str) -> str:
    """The module's path below server/ctxfold ("" for anything else, the generated code included)."""
    if not filename.startswith(PACKAGE):
        return ""
    relative = filename[len(PACKAGE) :]
    return "" if relative.startswith("v1/") else relative


def in_shell(module: str) -> bool:
    return module.startswith(SHELL_PACKAGES) or "/" not in module


def caller_of(frame: FrameType) -> tuple[str, bool]:
    """The module of the nearest frame of ctxfold's calling `frame`, and whether a frame of service/ is on
    the stack (the call is made inside the use case)."""
    caller, back, inside = "", frame.f_back, False
    while back is not None:
        module = module_of(back.f_code.co_filename)
        caller = caller or module
        inside = inside or module.startswith("service/")
        back = back.f_back
    return caller, inside


async def traced_prepare(tmp: Path) -> list[tuple[str, str, bool]]:
    """(caller, callee, inside the use case) of each call from one module into another by one delta Prepare
    of a cached session."""
    running = await start(bl.server_settings(await bl.fresh_database("sqlite", tmp, ""), tmp))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        stub = pb_grpc.ContextServiceStub(channel)
        config = pb.SessionConfig(context_window=128_000)
        session = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session
        known = 0

        async def prepare(number: int) -> None:
            nonlocal known
            message = pb.Message(role=pb.ROLE_USER, content=f"step {number}")
            request = pb.PrepareRequest(session_id=session.id, append=[message], known_view_version=known)
            async for event in stub.Prepare(request):
                if event.HasField("result"):
                    known = event.result.view_version

        for number in range(3):
            await prepare(number)
        calls: list[tuple[str, str, bool]] = []
        started: dict[int, FrameType] = {}  # frames seen starting: a later call event of one is a resumption

        def hook(frame: FrameType, event: str, _arg: Any) -> None:
            if event != "call" or started.get(id(frame)) is frame:
                return
            started[id(frame)] = frame
            callee = module_of(frame.f_code.co_filename)
            caller, inside = caller_of(frame)
            if callee and callee != caller:
                calls.append((caller, callee, inside or callee.startswith("service/")))

        sys.setprofile(hook)
        threading.setprofile(hook)
        try:
            await prepare(3)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        return calls
    finally:
        await channel.close()
        await running.stop(grace=0.5)


def path(stops: list[str]) -> dict[str, Any]:
    """The modules of `stops`, and how many stops enter a module entered before."""
    entered: set[str] = set()
    returns = 0
    for module in stops:
        returns += module in entered
        entered.add(module)
    return {"modules": sorted(entered), "stops": stops, "returns": returns}


def summarize(calls: list[tuple[str, str, bool]]) -> dict[str, Any]:
    into_shell = [call for call in calls if in_shell(call[1])]
    # Consecutive calls from one module into another (a loop over a helper) are one stop.
    stops = [call for i, call in enumerate(into_shell) if i == 0 or into_shell[i - 1][:2] != call[:2]]
    door = path([callee for _, callee, inside in stops if callee.startswith("api/") or not inside])
    use_case = path([callee for _, callee, inside in stops if not callee.startswith("api/") and inside])
    shell = [callee for _, callee, _ in stops]
    return {
        "shell_modules": sorted(set(shell)),
        "stops": shell,
        "door": door,
        "use_case": use_case,
        "engine_modules": sorted({callee for _, callee, _ in calls if not in_shell(callee)}),
        "goal_pass": len(use_case["modules"]) <= GOAL_MODULES and use_case["returns"] == 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON to PATH")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctxfold-prepare-path-") as tmp:
        result = summarize(asyncio.run(traced_prepare(Path(tmp))))
    for name in ("door", "use_case"):
        part = result[name]
        print(f"{name} ({len(part['modules'])} modules, {len(part['stops'])} stops, {part['returns']} returns):")
        print("  " + " -> ".join(part["stops"]))
    print(f"engine modules ({len(result['engine_modules'])}): {', '.join(result['engine_modules'])}")
    mark = "PASS" if result["goal_pass"] else "MISS"
    print(f"goal: at most {GOAL_MODULES} shell modules behind the door, no returns: {mark}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
