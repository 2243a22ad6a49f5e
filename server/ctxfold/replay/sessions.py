"""Recorded agent sessions in their native formats as OpenAI chat messages: what `parse_trace` reads
(so `ctxfold replay` takes a session file as it is) and what wrote the sessions under
tests/data/traces (`python -m ctxfold.replay.sessions IN.jsonl OUT.json`).

* **Claude Code** (`~/.claude/projects/<project>/<session>.jsonl`): one record per line. `user` and
  `assistant` records become messages; everything else (`summary`, `system` records such as
  `compact_boundary` or hook summaries, `file-history-snapshot`, `progress`, queue operations) is
  bookkeeping the model never saw and is left out, as are subagent records (`isSidechain`). An
  assistant message is written as one record per content block sharing `message.id`; they are joined
  into one message (text, `thinking` as reasoning, `tool_use` as tool calls). A user record's
  `tool_result` blocks become tool messages, its text blocks a user message — interruption notices,
  skill bodies, slash-command wrappers and the compaction summary ("This session is being continued
  from a previous conversation…") included, as the model received them.
* **cctrace XML** (`conversation_full.xml`, the export of jimmc414/cctrace): the same records, one
  `<message>` element each.
* **Codex CLI** (`~/.codex/sessions/…/rollout-*.jsonl`): `response_item` records. `message` items
  become user / assistant messages (`developer` ones system messages), `reasoning` summaries the
  next assistant message's reasoning, `function_call` / `custom_tool_call` / `local_shell_call` tool
  calls (a custom tool's raw input, e.g. an `apply_patch` patch, becomes its arguments as written),
  their outputs tool messages. `session_meta` instructions become the system prompt; `event_msg`,
  `turn_context` and `compacted` records are bookkeeping.

Tool results must follow their call (ctxfold's append rules): a user message recorded while calls
still wait for results is moved after them, and a call whose result was never recorded (an
interrupted one) is answered by `NO_RESULT`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

NO_RESULT = "[no result was recorded for this call]"
CLAUDE_CODE = "claude-code"
CODEX = "codex"
CCTRACE_XML = "cctrace-xml"
_CCTRACE = "{https://claude.ai/session-export/v1}"


class SessionFormatError(ValueError):
    """The text is not a session this module reads."""


def _records(text: str) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise SessionFormatError(f"line {number}: not valid JSON ({exc})") from None
        if isinstance(record, dict):
            records.append(record)
    return records


def detect(text: str) -> str:
    """CLAUDE_CODE, CODEX, CCTRACE_XML, or "" when the text is not a native session log."""
    if text.lstrip().startswith("<") and "<claude-session" in text[:1000]:
        return CCTRACE_XML
    for line in text.splitlines()[:50]:
        try:
            record = json.loads(line)
        except ValueError:
            return ""
        if not isinstance(record, dict):
            return ""
        kind = record.get("type")
        if kind in ("session_meta", "response_item", "turn_context", "event_msg"):
            return CODEX
        if "sessionId" in record or kind in ("file-history-snapshot", "summary", "queue-operation"):
            return CLAUDE_CODE
        if kind in ("user", "assistant") and isinstance(record.get("message"), dict):
            return CLAUDE_CODE
    return ""


def _text(value: Any) -> str:
    """A content value as text: strings as they are, text blocks joined, images named."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for block in value:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                kind = block.get("type", "")
                if "text" in block and isinstance(block["text"], str):
                    parts.append(block["text"])
                elif kind in ("image", "input_image"):
                    parts.append("[image]")
        return "\n".join(parts)
    if isinstance(value, dict):
        return _text(value.get("content", value.get("output", "")))
    return str(value)


@dataclass
class _Builder:
    """Appends messages in an order ctxfold accepts: results right after the calls they answer."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # call ids of the last assistant message
    held: list[dict[str, Any]] = field(default_factory=list)  # non-result messages seen while calls wait

    def _close(self) -> None:
        for call_id in self.waiting:
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": NO_RESULT})
        self.waiting = []
        self.messages += self.held
        self.held = []

    def assistant(self, content: str, reasoning: str, calls: Sequence[dict[str, Any]]) -> None:
        self._close()
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = list(calls)
        self.messages.append(message)
        self.waiting = [call["id"] for call in calls]

    def extend_assistant(self, content: str, reasoning: str, calls: Sequence[dict[str, Any]]) -> None:
        """More blocks of the last assistant message (Claude Code writes one record per block)."""
        message = self.messages[-1]
        if content:
            message["content"] = "\n\n".join(p for p in (message["content"], content) if p)
        if reasoning:
            message["reasoning_content"] = "\n\n".join(
                p for p in (message.get("reasoning_content", ""), reasoning) if p
            )
        if calls:
            message.setdefault("tool_calls", []).extend(calls)
            self.waiting += [call["id"] for call in calls]

    def result(self, call_id: str, content: str) -> None:
        if call_id not in self.waiting:
            return  # a result of no waiting call (a duplicate, or of a call that was not recorded)
        self.waiting.remove(call_id)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        if not self.waiting:
            self._close()

    def other(self, role: str, content: str) -> None:
        if not content.strip():
            return
        message = {"role": role, "content": content}
        if self.waiting:
            self.held.append(message)
        else:
            self.messages.append(message)

    def finish(self) -> list[dict[str, Any]]:
        # Calls still waiting at the end are the session's last action: left open, as recorded.
        self.messages += self.held
        self.held = []
        return self.messages


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def from_claude_code(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, messages) of a Claude Code session log (see the module docstring)."""
    return "", _claude_code_messages(_records(text))


def _cctrace_records(text: str) -> list[dict[str, Any]]:
    """The Claude Code records of a cctrace XML export (`<claude-session>`): each `<message>` with its
    `<text>`, `<thinking>`, `<tool-use>` (input as JSON text) and `<tool-result>` blocks; an
    assistant message's blocks share its `<request-id>`."""
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as exc:
        raise SessionFormatError(f"not valid XML ({exc})") from None
    records: list[dict[str, Any]] = []
    for element in root.iter(f"{_CCTRACE}message"):
        kind = element.findtext(f"{_CCTRACE}event-type", "")
        content = element.find(f"{_CCTRACE}content")
        if kind not in ("user", "assistant") or content is None:
            continue
        blocks: list[dict[str, Any]] = []
        for block in content:
            tag = block.tag.removeprefix(_CCTRACE)
            if tag == "text":
                blocks.append({"type": "text", "text": block.text or ""})
            elif tag == "thinking":
                blocks.append({"type": "thinking", "thinking": block.text or ""})
            elif tag == "tool-use":
                arguments = block.findtext(f"{_CCTRACE}input", "{}")
                blocks.append(
                    {"type": "tool_use", "id": block.get("id"), "name": block.get("name"), "input": arguments}
                )
            elif tag == "tool-result":
                blocks.append({"type": "tool_result", "tool_use_id": block.get("tool-use-id"), "content": block.text})
        message = {"role": kind, "content": blocks, "id": element.findtext(f"{_CCTRACE}request-id", "")}
        records.append({"type": kind, "message": message})
    return records


def _claude_code_messages(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    builder = _Builder()
    last_message_id = ""
    for record in records:
        kind = record.get("type")
        message = record.get("message")
        if kind not in ("user", "assistant") or not isinstance(message, dict) or record.get("isSidechain"):
            continue
        if record.get("isVisibleInTranscriptOnly"):
            continue
        content = message.get("content")
        if kind == "assistant":
            blocks = content if isinstance(content, list) else [{"type": "text", "text": _text(content)}]
            texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
            thinking = [b.get("thinking", "") for b in blocks if b.get("type") == "thinking"]
            calls = [
                _call(str(b["id"]), str(b["name"]), b.get("input", {})) for b in blocks if b.get("type") == "tool_use"
            ]
            message_id = str(message.get("id") or "")
            joined, reasoning = "\n\n".join(t for t in texts if t), "\n\n".join(t for t in thinking if t)
            if message_id and message_id == last_message_id:
                builder.extend_assistant(joined, reasoning, calls)
            elif joined or reasoning or calls:
                builder.assistant(joined, reasoning, calls)
            last_message_id = message_id
            continue
        last_message_id = ""
        if isinstance(content, list):
            texts = []
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    builder.result(str(block.get("tool_use_id", "")), _text(block.get("content")))
                else:
                    texts.append(_text([block]))
            builder.other("user", "\n".join(t for t in texts if t))
        else:
            builder.other("user", _text(content))
    return builder.finish()


def _codex_output(payload: dict[str, Any]) -> str:
    output = payload.get("output", "")
    if isinstance(output, str):
        try:  # older rollouts wrap the output as {"output": ..., "metadata": {...}}
            decoded = json.loads(output)
        except ValueError:
            return output
        return _text(decoded.get("output", output)) if isinstance(decoded, dict) else output
    return _text(output)


def from_codex(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, messages) of a Codex CLI rollout (see the module docstring)."""
    builder = _Builder()
    system = ""
    reasoning: list[str] = []
    pending_calls: list[dict[str, Any]] = []
    pending_text: list[str] = []

    def flush() -> None:
        nonlocal reasoning, pending_calls, pending_text
        if pending_text or pending_calls or reasoning:
            builder.assistant("\n\n".join(pending_text), "\n\n".join(reasoning), pending_calls)
        reasoning, pending_calls, pending_text = [], [], []

    for record in _records(text):
        payload = record.get("payload")
        if not isinstance(payload, dict):
            continue
        if record.get("type") == "session_meta":
            instructions = payload.get("instructions") or payload.get("base_instructions") or ""
            system = _text(instructions.get("text", "") if isinstance(instructions, dict) else instructions)
            continue
        if record.get("type") != "response_item":
            continue
        item = payload.get("type")
        if item == "reasoning":
            reasoning += [_text(s.get("text", "")) for s in payload.get("summary") or [] if isinstance(s, dict)]
        elif item == "message" and payload.get("role") == "assistant":
            pending_text.append(_text(payload.get("content")))
        elif item == "message":
            flush()
            role = "system" if payload.get("role") in ("developer", "system") else "user"
            builder.other(role, _text(payload.get("content")))
        elif item in ("function_call", "custom_tool_call", "local_shell_call"):
            call_id = str(payload.get("call_id") or payload.get("id") or "")
            if item == "local_shell_call":
                arguments: Any = payload.get("action", {})
            else:
                arguments = payload.get("arguments", payload.get("input", ""))
            pending_calls.append(_call(call_id, str(payload.get("name") or "local_shell"), arguments))
        elif item in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            flush()
            builder.result(str(payload.get("call_id", "")), _codex_output(payload))
    flush()
    return system, builder.finish()


def convert(name: str, text: str) -> dict[str, Any]:
    """A native session log as a trace document `{source, messages, tools}`."""
    kind = detect(text)
    if kind == CLAUDE_CODE:
        system, messages = from_claude_code(text)
    elif kind == CODEX:
        system, messages = from_codex(text)
    elif kind == CCTRACE_XML:
        system, messages = "", _claude_code_messages(_cctrace_records(text))
    else:
        raise SessionFormatError(f"{name}: neither a Claude Code session log nor a Codex CLI rollout")
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    return {"source": name, "format": kind, "messages": messages, "tools": []}


def main(argv: Iterable[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m ctxfold.replay.sessions SESSION.jsonl OUT.json", file=sys.stderr)
        return 2
    source, out = Path(args[0]), Path(args[1])
    document = convert(source.name, source.read_text(encoding="utf-8"))
    out.write_text(json.dumps(document, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
