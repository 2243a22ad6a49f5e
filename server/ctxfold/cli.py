"""The `ctxfold` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from ctxfold.config import FIELDS, ConfigError, load_settings


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="run the gRPC service", description="Run the ctxfold gRPC service.")
    serve.add_argument("--config", default="", help="TOML settings file (also CTXFOLD_CONFIG)")
    for name, f in FIELDS.items():
        flag = "--" + name.replace("_", "-")
        serve.add_argument(flag, dest=name, default=None, help=f"{f.metadata['help']} (env CTXFOLD_{name.upper()})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ctxfold", description="Context maintenance for long-running LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    from ctxfold.replay import cli as replay_cli

    replay_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "replay":
        sys.exit(replay_cli.run(args, parser))
    if args.command == "serve":
        flags = {name: getattr(args, name) for name in FIELDS}
        try:
            settings = load_settings(flags, os.environ, args.config)
        except (ValueError, OSError) as exc:
            parser.exit(2, f"ctxfold: {exc}\n")
        logging.basicConfig(
            level=settings.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        from ctxfold import telemetry
        from ctxfold.server import serve

        try:
            stop_telemetry = telemetry.configure(os.environ)
        except ValueError as exc:
            parser.exit(2, f"ctxfold: {exc}\n")
        try:
            asyncio.run(serve(settings))
        except ConfigError as exc:
            parser.exit(2, f"ctxfold: {exc}\n")
        finally:
            stop_telemetry()


if __name__ == "__main__":
    main()
