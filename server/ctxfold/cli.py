"""The `ctxfold` command: serve, replay, the read-only `sessions` / `show` for operators, and
`healthcheck` for containers.

Failures an operator can cause (a bad setting, an unreachable database, a port in use, an
unreachable server) end in one `ctxfold: …` line and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from ctxfold import __version__
from ctxfold.config import FIELDS, Settings, load_settings
from ctxfold.engine.errors import ConfigError


def _default_text(name: str) -> str:
    value = getattr(Settings(), name)
    return repr(value) if value == "" else str(value)


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    serve = sub.add_parser("serve", help="run the gRPC service", description="Run the ctxfold gRPC service.")
    serve.add_argument("--config", default="", help="TOML settings file (default: none; env CTXFOLD_CONFIG)")
    for name, f in FIELDS.items():
        flag = "--" + name.replace("_", "-")
        # Flags default to None so that only the given ones override the environment and the file.
        help_text = f"{f.metadata['help']} (default {_default_text(name)}; env CTXFOLD_{name.upper()})"
        serve.add_argument(flag, dest=name, default=None, help=help_text.replace("%", "%%"))
    return serve


def _quiet_grpc_core() -> None:
    """gRPC core's own stderr log (a raw line beside our message for a port in use) is off unless the
    operator sets GRPC_VERBOSITY: its errors reach us as exceptions and statuses anyway. It is read
    when grpc loads, so this runs before anything imports grpc."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    flags = {name: getattr(args, name) for name in FIELDS}
    try:
        settings = load_settings(flags, os.environ, args.config)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"ctxfold: {exc}\n")
    level = logging.getLevelName(settings.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # One ready line at INFO: Alembic's plugin and migration lines at every start show only at DEBUG.
    logging.getLogger("alembic").setLevel(logging.DEBUG if level <= logging.DEBUG else logging.WARNING)
    from ctxfold import telemetry
    from ctxfold.server import StartupError, serve

    try:
        stop_telemetry = telemetry.configure(os.environ)
    except ValueError as exc:
        parser.exit(2, f"ctxfold: {exc}\n")
    try:
        asyncio.run(serve(settings))
    except ConfigError as exc:
        parser.exit(2, f"ctxfold: {exc}\n")
    except StartupError as exc:
        parser.exit(1, f"ctxfold: {exc}\n")
    finally:
        stop_telemetry()


def main(argv: list[str] | None = None) -> None:
    _quiet_grpc_core()
    parser = argparse.ArgumentParser(prog="ctxfold", description="Context maintenance for long-running LLM agents.")
    parser.add_argument("--version", action="version", version=f"ctxfold {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = _serve_parser(sub)
    from ctxfold import healthcheck, inspection
    from ctxfold.replay import cli as replay_cli

    replay_cli.add_parser(sub)
    inspection.add_parsers(sub)
    healthcheck.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "replay":
        sys.exit(replay_cli.run(args, parser))
    if args.command in ("sessions", "show"):
        try:
            sys.exit(inspection.run(args))
        except inspection.InspectError as exc:
            parser.exit(1, f"ctxfold {args.command}: {exc}\n")
    if args.command == "healthcheck":
        try:
            sys.exit(healthcheck.run(args, serve_parser, print))
        except healthcheck.HealthcheckError as exc:
            parser.exit(1, f"ctxfold healthcheck: {exc}\n")
    _serve(args, parser)


if __name__ == "__main__":
    main()
