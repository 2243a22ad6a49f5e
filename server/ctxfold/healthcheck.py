"""`ctxfold healthcheck`: is the `ctxfold serve` of this container serving? It resolves the server's settings
from /proc/PID as `serve` did (docs/operations.md, Health, reflection, shutdown)."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ctxfold.config import Settings, load_settings


class HealthcheckError(Exception):
    """Why the server is not healthy (or cannot be checked), in one line."""


def server_process(pid: int) -> tuple[list[str], dict[str, str], str]:
    """The command line, environment and working directory of process `pid`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ_raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError as exc:
        raise HealthcheckError(f"cannot read process {pid}: {exc.strerror or exc}") from None
    environ = dict(item.decode(errors="replace").split("=", 1) for item in environ_raw if b"=" in item)
    return [a.decode(errors="replace") for a in argv if a], environ, cwd


def served_settings(
    argv: Sequence[str], environ: Mapping[str, str], serve_parser: argparse.ArgumentParser, cwd: str = ""
) -> Settings:
    """The settings `ctxfold serve` resolved from this command line and environment, in its working
    directory `cwd` (a relative --config or CTXFOLD_CONFIG names a file there, not in the check's)."""
    if "serve" not in argv:
        raise HealthcheckError(f"not a `ctxfold serve` process: {' '.join(argv)}")
    args, _ = serve_parser.parse_known_args(list(argv[list(argv).index("serve") + 1 :]))
    config = args.config or environ.get("CTXFOLD_CONFIG", "")
    if config and cwd:
        config = str(Path(cwd, config))
    try:
        return load_settings(vars(args), environ, config)
    except (ValueError, OSError) as exc:
        raise HealthcheckError(f"the server's settings do not load: {exc}") from None


def check_target(listen: str) -> str:
    """Where to reach a server listening on `listen`: a wildcard host means this machine."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check(settings: Settings, timeout: float) -> str:
    """A line saying how the server answered; raises HealthcheckError when it is not serving."""
    target = check_target(settings.listen)
    if settings.tls_cert:
        host, _, port = target.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return f"{target}: accepting connections (TLS: gRPC health not checked)"
        except OSError as exc:
            raise HealthcheckError(f"{target}: {exc.strerror or exc}") from None
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            raise HealthcheckError(f"{target}: {exc.code().name}: {exc.details()}") from None
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        raise HealthcheckError(f"{target}: {status}")
    return f"{target}: {status}"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "healthcheck",
        help="check the health of a running `ctxfold serve` (for container HEALTHCHECKs)",
        description=(
            "Check that the `ctxfold serve` process PID is serving, on the address its own flags, "
            "CTXFOLD_* environment and --config file make it listen on."
        ),
    )
    p.add_argument("--pid", type=int, default=1, help="the server's process id (default 1: a container's)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer (default 3)")


def run(args: argparse.Namespace, serve_parser: argparse.ArgumentParser, out: Callable[[str], None]) -> int:
    argv, environ, cwd = server_process(args.pid)
    out(check(served_settings(argv, environ, serve_parser, cwd), args.timeout))
    return 0
