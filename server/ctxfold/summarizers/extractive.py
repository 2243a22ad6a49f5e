"""The default summarizer: offline, deterministic, no LLM. It builds the seven-section briefing from
the folded messages themselves and trims the oldest items until it fits `max_tokens`."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ctxfold.engine import estimator
from ctxfold.engine.model import Role
from ctxfold.engine.tool_results import RESULT_REF
from ctxfold.summarizers.base import IN_PROCESS_PROVIDER, SECTIONS, OnDelta, SummaryRequest, SummaryResult

_PATH = re.compile(
    r"(?<![\w/.-])(?:[\w.-]+/)*[\w-]+\.(?:py|pyi|js|ts|tsx|go|java|rs|c|h|cc|cpp|rb|md|txt|json|ya?ml|toml|cfg|ini|sh|sql|html|css)\b"
)
_ERROR_LINE = re.compile(r"(?i)(error|exception|traceback|failed|fatal|panic)")
_SHORT = 400
_ITEM = 300
HEADER = "[ctxfold summary of earlier conversation]"
REFS_LABEL = "Folded tool results (read with ReadToolResult by result_ref): "
# At most this share of the summary lists refs; the newest are kept.
REFS_SHARE = 0.4
_OMITTED = re.compile(r"\(and (\d+) older ones:")


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _sections(request: SummaryRequest) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {name: [] for name in SECTIONS}
    files: dict[str, None] = {}
    calls: dict[str, str] = {}
    if request.previous_summary:
        # The previous summary's refs are carried forward on their own line (see _folded_refs).
        earlier = request.previous_summary.replace(HEADER, "").split(REFS_LABEL)[0]
        sections["Standing facts & constraints"].append("Earlier briefing: " + _clip(earlier, 4 * _ITEM))
    for message in request.folded:
        text = message.content
        for path in _PATH.findall(text):
            files[path] = None
        if message.role is Role.USER and not message.summary:
            bucket = "Goal" if not sections["Goal"] else "Standing facts & constraints"
            sections[bucket].append("User: " + _clip(text, _SHORT))
        elif message.role is Role.SYSTEM:
            sections["Standing facts & constraints"].append("System: " + _clip(text, _SHORT))
        elif message.role is Role.ASSISTANT and message.source is not None:
            for call in message.source.tool_calls:
                calls[call.id] = f"{call.name}({_clip(call.arguments, 160)})"
                for path in _PATH.findall(call.arguments):
                    files[path] = None
            if text.strip():
                sections["Decisions"].append(_clip(text, _ITEM))
        elif message.role is Role.TOOL and message.source is not None:
            source = message.source
            invocation = calls.get(source.tool_call_id, source.tool_call_id)
            errors = [line.strip() for line in text.splitlines() if _ERROR_LINE.search(line)]
            outcome = _clip(errors[-1] if errors else _first_line(text), 160) or "(no output)"
            sections["Commands & outcomes"].append(f"{invocation} -> {outcome} [result_ref={source.result_ref}]")
            if errors:
                sections["Errors & fixes"].append(f"{_clip(errors[-1], 200)} [result_ref={source.result_ref}]")
    last_plan = next(
        (m.content for m in reversed(request.folded) if m.role is Role.ASSISTANT and m.content.strip()), ""
    )
    if last_plan:
        sections["Pending & next step"].append("Last stated plan: " + _clip(last_plan, 2 * _ITEM))
    if request.focus:
        sections["Pending & next step"].append("Focus: " + _clip(request.focus, _SHORT))
    sections["Files & code"] = sorted(files)
    return sections


def _refs_line(refs: Sequence[str], omitted: int) -> str:
    line = REFS_LABEL + ", ".join(refs)
    if omitted:
        line += f" (and {omitted} older ones: ListMessages shows every tool result with its result_ref)"
    return line


def _folded_refs(request: SummaryRequest) -> tuple[list[str], int]:
    """Every folded result's ref, the previous summary's first (rolled forward), newest kept when the
    list would take more than REFS_SHARE of the summary; also how many were left out."""
    previous = RESULT_REF.findall(request.previous_summary)
    omitted_before = sum(int(n) for n in _OMITTED.findall(request.previous_summary))
    new = [m.source.result_ref for m in request.folded if m.role is Role.TOOL and m.source and m.source.result_ref]
    refs = list(dict.fromkeys([*previous, *new]))
    budget = int(request.max_tokens * REFS_SHARE)
    keep = len(refs)
    while keep and estimator.count_text(_refs_line(refs[len(refs) - keep :], 0)) > budget:
        keep = keep * 3 // 4
    return refs[len(refs) - keep :], omitted_before + len(refs) - keep


def _render(sections: dict[str, list[str]], refs_line: str) -> str:
    parts = [HEADER]
    for name in SECTIONS:
        items = sections[name] or ["(none)"]
        parts.append(f"## {name}\n" + "\n".join(f"- {item}" for item in items))
    if refs_line:
        parts.append(refs_line)
    return "\n\n".join(parts)


def briefing(request: SummaryRequest) -> str:
    """The briefing within `request.max_tokens`: the refs of folded results (rolled forward from the
    previous summary) come first; then the oldest items of the longest section go until it fits."""
    sections = _sections(request)
    refs, omitted = _folded_refs(request)
    refs_line = _refs_line(refs, omitted) if refs or omitted else ""
    text = _render(sections, refs_line)
    while estimator.count_text(text) > request.max_tokens:
        longest = max(SECTIONS, key=lambda name: len(sections[name]))
        if not sections[longest]:
            break  # only headers and refs left; the caller rejects a summary that is too long
        # Drop a batch at a time so a long fold needs few re-counts.
        del sections[longest][: max(1, len(sections[longest]) // 4)]
        text = _render(sections, refs_line)
    return text


class ExtractiveSummarizer:
    name = "extractive"
    provider = IN_PROCESS_PROVIDER
    model = "extractive"
    server_address = ""

    def __init__(self, input_window_tokens: int = 1_000_000):
        self.input_window_tokens = input_window_tokens

    async def summarize(self, request: SummaryRequest, on_delta: OnDelta | None = None) -> SummaryResult:
        text = briefing(request)
        if on_delta is not None:
            await on_delta(text)
        return SummaryResult(text=text, finish_reason="stop", input_tokens=0, output_tokens=0)
