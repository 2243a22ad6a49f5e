"""The `ctxfold` command: serve, gateway, replay, `sessions` / `show` and `healthcheck`. A failure an operator
can cause ends in one `ctxfold: …` line and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ctxfold import __version__
from ctxfold.config import FIELDS, load_settings
from ctxfold.engine.errors import ConfigError
from ctxfold.gateway import settings as gateway_settings


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    serve = sub.add_parser("serve", help="run the gRPC service", description="Run the ctxfold gRPC service.")
    serve.add_argument("--config", default="", help="TOML settings file (default: none; env CTXFOLD_CONFIG)")
    for name, f in FIELDS.items():
        _setting_flag(serve, name, f, "CTXFOLD_")
    for name in gateway_settings.EMBEDDED_FIELDS:
        _setting_flag(
            serve, name, gateway_settings.FIELDS[name], gateway_settings.ENV_PREFIX, "with --gateway-listen: "
        )
    return serve


def _setting_flag(
    parser: argparse.ArgumentParser, name: str, f: dataclasses.Field[Any], prefix: str, lead: str = ""
) -> None:
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[operator]
    help_text = f"{lead}{f.metadata['help']} (default {value if value != '' else repr('')}; env {prefix}{name.upper()})"
    # Flags default to None so that only the given ones override the environment and the file.
    parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=help_text.replace("%", "%%"))


def _gateway_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    gateway = sub.add_parser(
        "gateway",
        help="run the provider-compatible HTTP gateway",
        description="Run the HTTP gateway: agents point their OpenAI or Anthropic base URL at it and get ctxfold.",
    )
    gateway.add_argument("--config", default="", help="TOML settings file (env CTXFOLD_GATEWAY_CONFIG)")
    for name, f in gateway_settings.FIELDS.items():
        _setting_flag(gateway, name, f, gateway_settings.ENV_PREFIX)
    return gateway


def _gateway(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    try:
        settings = gateway_settings.load_gateway_settings(vars(args), os.environ, args.config)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"ctxfold gateway: {exc}\n")
    stop_telemetry = _logging_and_telemetry(parser, "ctxfold gateway", settings.log_level)
    from ctxfold.gateway.app import serve_gateway

    try:
        asyncio.run(serve_gateway(settings))
    except OSError as exc:
        parser.exit(2, f"ctxfold gateway: cannot listen on {settings.listen}: {exc.strerror}\n")
    finally:
        stop_telemetry()


def _logging_and_telemetry(parser: argparse.ArgumentParser, command: str, log_level: str) -> Callable[[], object]:
    """Logs to stderr at `log_level`, installs telemetry as OTEL_* says; returns telemetry's shutdown."""
    level = logging.getLevelName(log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # One ready line at INFO: Alembic's plugin and migration lines at every start show only at DEBUG.
    logging.getLogger("alembic").setLevel(logging.DEBUG if level <= logging.DEBUG else logging.WARNING)
    from ctxfold import telemetry

    try:
        return telemetry.configure(os.environ)
    except ValueError as exc:
        parser.exit(2, f"{command}: {exc}\n")


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    try:
        settings = load_settings(vars(args), os.environ, args.config)
        # With --gateway-listen, the gateway runs beside the server, a client of it on loopback.
        gateway: gateway_settings.GatewaySettings | None = None
        if settings.gateway_listen:
            flags = {name: getattr(args, name) for name in gateway_settings.EMBEDDED_FIELDS}
            fixed = {"listen": settings.gateway_listen, "tls_ca": settings.tls_cert, "log_level": settings.log_level}
            gateway = gateway_settings.load_gateway_settings(flags, os.environ, **fixed)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"ctxfold: {exc}\n")
    stop_telemetry = _logging_and_telemetry(parser, "ctxfold", settings.log_level)
    from ctxfold.server import StartupError, serve

    try:
        asyncio.run(serve(settings, gateway))
    except ConfigError as exc:
        parser.exit(2, f"ctxfold: {exc}\n")
    except StartupError as exc:
        parser.exit(1, f"ctxfold: {exc}\n")
    finally:
        stop_telemetry()


@contextlib.contextmanager
def _stdout_may_close() -> Iterator[None]:
    """`ctxfold show … | head`: a closed pipe exits quietly with 141 (128 + SIGPIPE), no BrokenPipeError traceback."""
    try:
        try:
            yield
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at devnull so that flush cannot fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)


def main(argv: list[str] | None = None) -> None:
    # gRPC core's own stderr log is off unless set (its errors reach us as exceptions); read when grpc loads.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    parser = argparse.ArgumentParser(prog="ctxfold", description="Context maintenance for long-running LLM agents.")
    parser.add_argument("--version", action="version", version=f"ctxfold {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = _serve_parser(sub)
    gateway_parser = _gateway_parser(sub)
    from ctxfold import healthcheck, inspection
    from ctxfold.replay import cli as replay_cli

    replay_cli.add_parser(sub)
    inspection.add_parsers(sub)
    healthcheck.add_parser(sub)
    args = parser.parse_args(argv)
    with _stdout_may_close():
        if args.command == "replay":
            sys.exit(replay_cli.run(args, parser))
        try:
            if args.command in ("sessions", "show"):
                sys.exit(inspection.run(args))
            if args.command == "healthcheck":
                sys.exit(healthcheck.run(args, serve_parser, print))
        except (inspection.InspectError, healthcheck.HealthcheckError) as exc:
            parser.exit(1, f"ctxfold {args.command}: {exc}\n")
        if args.command == "gateway":
            _gateway(args, gateway_parser)
        else:
            _serve(args, parser)


if __name__ == "__main__":
    main()
