"""Generates the blocking client `_sync_client.py` from the asyncio client `_async_client.py`.

    python scripts/unasync.py          # writes src/ctxfold_client/_sync_client.py
    python scripts/unasync.py --check  # exits 1 when the committed file differs (tests run this)

The two clients are one implementation: the async source is translated line by line by the
substitutions below (the approach of encode/httpcore's scripts/unasync.py), so no method is kept by
hand twice. A line the substitutions leave containing `async`, `await` or `aio` fails the run.
The result is put through `ruff format` and ruff's import sorting, as every file of the package.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "ctxfold_client"
SOURCE = PACKAGE / "_async_client.py"
TARGET = PACKAGE / "_sync_client.py"

HEADER = (
    '"""`Client`: the blocking client (grpc). GENERATED from `_async_client.py` by scripts/unasync.py:\n'
    'edit that file and run the script, never this one."""\n'
)
DROP = "<drop this line>"
SUBSTITUTIONS: list[tuple[str, str]] = [
    (r"^import grpc\.aio$", DROP),
    (r"\bAsyncGenerator\[(.+), None\]", r"Generator[\1, None, None]"),
    (r"\bAsyncGenerator\b", "Generator"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncClient\b", "Client"),
    (r"\bContextServiceAsyncStub\b", "ContextServiceStub"),
    (r"\bgrpc\.aio\.", "grpc."),
    (r"\baclosing\b", "closing"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\bawait core\.notify_async\(", "core.notify("),
    (r"\bawait core\.feed_async\(stream, ", "stream.feed("),
    (r"\basync (def|for|with) ", r"\1 "),
    (r"(?<![\w)\]])\(await ([\w.]+\([^()]*\))\)", r"\1"),  # (await f(x)).y -> f(x).y
    (r"\bawait ", ""),
]
LEFTOVER = re.compile(r"\b(async|await|aio)\b")


def translate(source: str) -> str:
    body = source.split('"""', 2)[2].lstrip("\n")  # the async module docstring is replaced by HEADER
    lines: list[str] = []
    for number, original in enumerate(body.splitlines(), start=1):
        line = original
        for pattern, replacement in SUBSTITUTIONS:
            line = re.sub(pattern, replacement, line)
        if line == DROP:
            continue
        if LEFTOVER.search(line.split("#", 1)[0]):
            raise SystemExit(f"{SOURCE.name}:{number}: no substitution covers {original.strip()!r}")
        lines.append(line)
    return _ruff(HEADER + "\n" + "\n".join(lines) + "\n")


def _ruff(text: str) -> str:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        raise SystemExit("ruff not found: install the test extra (pip install '.[test]')")
    for command in (["check", "--fix", "--select", "I", "--quiet"], ["format", "--quiet"]):
        done = subprocess.run(
            [ruff, *command, "--stdin-filename", str(TARGET), "-"],
            input=text,
            capture_output=True,
            text=True,
            check=True,
            cwd=PACKAGE.parent.parent,
        )
        text = done.stdout
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail when the committed file is stale")
    args = parser.parse_args()
    generated = translate(SOURCE.read_text(encoding="utf-8"))
    if args.check:
        if TARGET.read_text(encoding="utf-8") != generated:
            print(f"{TARGET.name} is stale: run python scripts/unasync.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(generated, encoding="utf-8", newline="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
