#!/usr/bin/env python3
"""Which modules of the shell one append-only Prepare passes through (issue 22's goal: at most 6, never
returning to one it has left), traced with a profile hook on an in-process server over SQLite.

A session is warmed with three delta Prepares (its context cached), then one more is traced: every call
into a module of `server/ctxfold` is recorded, and the sequence of shell modules (service/, store/, api/
and the top-level modules; the engine is listed apart) is printed with its stops and returns.

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


async def traced_prepare(tmp: Path) -> list[str]:
    """The modules entered, in order (consecutive repeats merged), by one delta Prepare of a cached session."""
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
        entered: list[str] = []

        def hook(frame: FrameType, event: str, _arg: Any) -> None:
            module = module_of(frame.f_code.co_filename) if event == "call" else ""
            if module and (not entered or entered[-1] != module):
                entered.append(module)

        sys.setprofile(hook)
        threading.setprofile(hook)
        try:
            await prepare(3)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        return entered
    finally:
        await channel.close()
        await running.stop(grace=0.5)


def summarize(entered: list[str]) -> dict[str, Any]:
    shell = [m for m in entered if in_shell(m)]
    stops = [m for i, m in enumerate(shell) if i == 0 or shell[i - 1] != m]
    left: set[str] = set()
    returns = 0
    for index, module in enumerate(stops):
        returns += module in left
        if index:
            left.add(stops[index - 1])
    return {
        "shell_modules": sorted(set(stops)),
        "stops": stops,
        "returns": returns,
        "engine_modules": sorted({m for m in entered if not in_shell(m)}),
        "goal_pass": len(set(stops)) <= GOAL_MODULES and returns == 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON to PATH")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctxfold-prepare-path-") as tmp:
        result = summarize(asyncio.run(traced_prepare(Path(tmp))))
    print(f"shell modules ({len(result['shell_modules'])}): {', '.join(result['shell_modules'])}")
    print(f"engine modules ({len(result['engine_modules'])}): {', '.join(result['engine_modules'])}")
    print(f"stops {len(result['stops'])}, returns to a module left {result['returns']}")
    print(" -> ".join(result["stops"]))
    mark = "PASS" if result["goal_pass"] else "MISS"
    print(f"goal: at most {GOAL_MODULES} shell modules, no returns: {mark}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
