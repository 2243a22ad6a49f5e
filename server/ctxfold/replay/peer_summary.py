"""The summary every summarizing baseline writes, pure and fixed: a stand-in for what a peer's LLM
summarizer returns when asked for a self-contained resume briefing (the task, what the person said,
decisions, files, commands and their outcomes, errors, the plan), trimmed to a token budget.

It is deliberately not ctxfold's summarizer: ctxfold's summary is shaped by the sections its engine
renders around it, and a baseline measured with it would change whenever ctxfold does. Baselines
have no store, so the briefing names no `result_ref`."""

from __future__ import annotations

from collections.abc import Sequence

from ctxfold.engine import estimator
from ctxfold.replay import probes
from ctxfold.replay.trace import Msg

HEADER = "[summary of earlier conversation]"
SECTIONS = ("Goal", "User said", "Decisions", "Files", "Commands & outcomes", "Errors", "Pending & next step")
PROMPT = (
    "Write a resume briefing of the conversation above so that work can continue from it alone, with the "
    "sections " + "; ".join(SECTIONS) + ". Keep identifiers, paths, commands and numbers exactly as written."
)
_QUOTE = 400  # characters of a user message
_ITEM = 300
_CALL = 160
_EARLIER = 1200  # characters of the previous summary rolled in
_ERROR_WORDS = ("error", "exception", "traceback", "failed", "fatal", "panic")


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _outcome(text: str) -> tuple[str, str]:
    """The line a result is remembered by (its last error line, else its first line) and the error."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if any(word in line.lower() for word in _ERROR_WORDS)]
    if errors:
        return _clip(errors[-1], _CALL), _clip(errors[-1], _ITEM)
    return (_clip(lines[0], _CALL) if lines else "(no output)"), ""


def request(view: Sequence[Msg], previous: str, max_tokens: int) -> tuple[Msg, ...]:
    """The summary request as an LLM receives it: the view so far, then the instruction."""
    ask = PROMPT + f" Stay within {max_tokens} tokens."
    if previous:
        ask += " Roll the earlier summary in: keep what still matters from it."
    return (*view, Msg("user", ask))


def briefing(previous: str, folded: Sequence[Msg], roles: probes.Roles, text_actions: bool, max_tokens: int) -> str:
    """The briefing of `folded` (rolling `previous` in), within `max_tokens`: the oldest items of the
    longest section go first."""
    sections: dict[str, list[str]] = {name: [] for name in SECTIONS}
    if previous:
        sections["Goal"].append("Earlier: " + _clip(previous.removeprefix(HEADER), _EARLIER))
    calls: dict[str, str] = {}
    action = ""
    files: dict[str, None] = {}
    for message in folded:
        if message.source in roles.person:
            key = "Goal" if not sections["Goal"] else "User said"
            sections[key].append(_clip(message.content, _QUOTE))
        elif message.source in roles.tool_output:
            invocation = calls.get(message.tool_call_id, action or "command")
            line, error = _outcome(message.content)
            sections["Commands & outcomes"].append(f"{invocation} -> {line}")
            if error:
                sections["Errors"].append(error)
        elif message.role == "assistant":
            for call in message.tool_calls:
                calls[call.id] = f"{call.name}({_clip(call.arguments, _CALL)})"
            action = _clip(probes.text_action(message), _CALL) if text_actions else ""
            files.update(dict.fromkeys(probes.message_paths(message, text_actions)))
            if message.content.strip():
                sections["Decisions"].append(_clip(message.content, _ITEM))
    plan = next((m.content for m in reversed(folded) if m.role == "assistant" and m.content.strip()), "")
    if plan:
        sections["Pending & next step"].append("Last stated plan: " + _clip(plan, 2 * _ITEM))
    sections["Files"] = list(files)
    text = _render(sections)
    while estimator.count_text(text) > max_tokens:
        longest = max(SECTIONS, key=lambda name: len(sections[name]))
        if not sections[longest]:
            break
        del sections[longest][: max(1, len(sections[longest]) // 4)]
        text = _render(sections)
    return text


def _render(sections: dict[str, list[str]]) -> str:
    parts = [HEADER]
    for name in SECTIONS:
        if sections[name]:
            parts.append(f"## {name}\n" + "\n".join(f"- {item}" for item in sections[name]))
    return "\n\n".join(parts)
