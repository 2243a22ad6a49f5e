"""Test data shared by the sync and asyncio end-to-end tests."""

from __future__ import annotations

from typing import Any

from ctxfold_client import Message, SessionConfig, assistant, tool_call, tool_result

# The recipe that makes the server fold: a small window and ~1500-character tool results.
FOLDING_CONFIG = SessionConfig(context_window=4000, max_output_tokens=256, system_prompt="You are a test agent.")
ROOMY_CONFIG = SessionConfig(context_window=200_000, max_output_tokens=1024)
TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files under a directory.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


def listing(path: str) -> str:
    """About 1500 characters of a deterministic `ls -l` of `path`."""
    lines = [
        f"-rw-r--r-- 1 dev staff {index * 7919 % 99999:>5} Mar {1 + index % 28:>2} {path}/module_{index}.py"
        for index in range(30)
    ]
    return "\n".join(lines)


def tool_pair(index: int, prefix: str = "call") -> list[Message]:
    """An assistant tool call and its ~1500-character result."""
    call_id = f"{prefix}_{index}"
    path = f"src/dir_{index}"
    return [
        assistant(f"Listing {path}.", tool_calls=[tool_call(call_id, "list_files", {"path": path})]),
        tool_result(call_id, listing(path)),
    ]


def multibyte_text(min_bytes: int = 80_000) -> str:
    """Varied text with 1-, 2-, 3- and 4-byte UTF-8 characters, at least `min_bytes` long."""
    lines: list[str] = []
    size = 0
    index = 0
    while size < min_bytes:
        line = f"{index:05d} naïve café — 漢字かな交じり文 🦀🚀 Zürich Ωμέγα ⟨{index * 7919 % 10007}⟩"
        lines.append(line)
        size += len(line.encode()) + 1
        index += 1
    return "\n".join(lines)
