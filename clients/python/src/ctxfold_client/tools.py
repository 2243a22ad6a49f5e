"""Tools the model can call: `read_tool_result` (page through any result whose `result_ref` it sees
in the view, the folded-results index included) and `context_budget` (how full the window is).

`tool_definitions(format)` gives their definitions for OpenAI Chat Completions, OpenAI Responses
or Anthropic Messages; `client.dispatch_tool_call(session_id, name, arguments)` answers a call with
the text to append as its tool result. This module is the I/O-free part: parsing a call and
writing the answer texts (clients/README.md, "A tool the model can call").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ctxfold_client import _json
from ctxfold_client._gen.enums import ErrorReason
from ctxfold_client.errors import CtxfoldError
from ctxfold_client.models import Message, ToolResultPage, View

READ_TOOL_RESULT = "read_tool_result"
CONTEXT_BUDGET = "context_budget"
ToolFormat = Literal["openai_chat", "openai_responses", "anthropic"]

_SCHEMAS: Mapping[str, tuple[str, dict[str, Any]]] = {
    READ_TOOL_RESULT: (
        "Read a stored tool result by its result_ref, one page at a time. Use it when the context shows "
        "a result_ref for output that was shortened or folded away, including the folded-results index.",
        {
            "type": "object",
            "properties": {
                "result_ref": {"type": "string", "description": "The result_ref named in the context."},
                "offset": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 0,
                    "description": "UTF-8 byte offset to read from; each page names the next offset.",
                },
            },
            "required": ["result_ref"],
        },
    ),
    CONTEXT_BUDGET: (
        "Report how full the context window is: the tokens of the current context, the level at which "
        "older history is folded into a summary, and the hard limit.",
        {"type": "object", "properties": {}},
    ),
}

# The server's answers to a model's mistake, which the model can act on (other failures raise).
MODEL_MISTAKES = frozenset(
    {
        ErrorReason.RESULT_REF_REQUIRED,
        ErrorReason.RESULT_REF_NOT_FOUND,
        ErrorReason.RESULT_REF_AMBIGUOUS,
        ErrorReason.OFFSET_OUT_OF_RANGE,
        ErrorReason.OFFSET_NOT_CHAR_BOUNDARY,
        ErrorReason.INVALID_REQUEST,
    }
)


def tool_definitions(format: ToolFormat) -> list[dict[str, Any]]:
    """The definitions of `read_tool_result` and `context_budget` in a provider's tool format."""
    out: list[dict[str, Any]] = []
    for name, (description, parameters) in _SCHEMAS.items():
        if format == "openai_chat":
            out.append(
                {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}
            )
        elif format == "openai_responses":
            # Responses function tools default to strict, whose schemas cannot have optional fields (offset).
            out.append(
                {
                    "type": "function",
                    "name": name,
                    "description": description,
                    "parameters": parameters,
                    "strict": False,
                }
            )
        elif format == "anthropic":
            out.append({"name": name, "description": description, "input_schema": parameters})
        else:
            raise CtxfoldError.invalid_argument(
                ErrorReason.INVALID_CLIENT_ARGUMENT,
                "format",
                f"unknown tool format {format!r}: openai_chat, openai_responses or anthropic",
            )
    return out


def hides_results(view: View | Sequence[Message]) -> bool:
    """Whether the view shows something only in part that `read_tool_result` reads whole: a bounded
    or pruned message, or a summary (whose folded-results index names the folded results)."""
    if isinstance(view, View) and view.folded_results_ref:
        return True
    messages = view.messages if isinstance(view, View) else view
    return any(m.truncated or m.pruned or m.summary for m in messages)


def request_tools(
    tools: str | Sequence[Mapping[str, Any]] | None, view: View | Sequence[Message], format: ToolFormat
) -> list[dict[str, Any]]:
    """The tools of a provider request: the session's (a list, or its JSON text), then the
    `read_tool_result` definition when the view hides a result and no tool of that name is given."""
    if isinstance(tools, str):
        try:
            given = json.loads(tools) if tools else []
        except ValueError as exc:
            raise CtxfoldError.invalid_argument(ErrorReason.INVALID_CONFIG, "tools", f"not JSON ({exc})") from None
    else:
        given = list(tools or ())
    if not isinstance(given, list):
        raise CtxfoldError.invalid_argument(ErrorReason.INVALID_CONFIG, "tools", "tools must be a JSON array")
    names = {_tool_name(tool) for tool in given if isinstance(tool, Mapping)}
    if hides_results(view) and READ_TOOL_RESULT not in names:
        given.append(tool_definitions(format)[0])
    return given


def _tool_name(tool: Mapping[str, Any]) -> object:
    function = tool.get("function")
    return function.get("name") if isinstance(function, Mapping) else tool.get("name")


@dataclass(frozen=True, slots=True)
class ReadCall:
    result_ref: str
    offset: int


@dataclass(frozen=True, slots=True)
class BudgetCall:
    pass


@dataclass(frozen=True, slots=True)
class BadCall:
    answer: str


ParsedCall = ReadCall | BudgetCall | BadCall


def parse_call(name: str, arguments: str | Mapping[str, Any]) -> ParsedCall | None:
    """The call of a ctxfold tool; None when `name` is not one (the agent runs its own tools)."""
    if name not in _SCHEMAS:
        return None
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return BadCall(f"error: invalid arguments: not JSON ({exc.msg})")
    else:
        decoded = dict(arguments)
    if not isinstance(decoded, dict):
        return BadCall("error: invalid arguments: expected a JSON object")
    if name == CONTEXT_BUDGET:
        return BudgetCall()
    ref, offset = decoded.get("result_ref"), decoded.get("offset", 0)
    if not isinstance(ref, str) or not ref:
        return BadCall('error: invalid arguments: "result_ref" (a string from the context) is required')
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        return BadCall('error: invalid arguments: "offset" must be a non-negative integer')
    return ReadCall(ref, offset)


def page_answer(page: ToolResultPage) -> str:
    """The page's text, with a footer naming the next offset when the result continues."""
    if page.complete:
        return page.data
    return (
        f"{page.data}\n\n[read_tool_result: bytes {page.offset}-{page.next_offset} of {page.total_bytes}; "
        f'call read_tool_result with result_ref "{page.result_ref}" and offset {page.next_offset} for more]'
    )


def error_answer(error: CtxfoldError) -> str:
    """The answer to a call the server refused as the model's mistake; other failures re-raise."""
    if error.reason not in MODEL_MISTAKES:
        raise error
    return f"error: {error.reason}: {error.message}"


def budget_answer(view: View | None) -> str:
    if view is None:
        return "error: no context prepared by this client yet"
    budget = {
        "estimated_tokens": view.estimated_tokens,
        "trigger_tokens": view.trigger_tokens,
        "hard_limit_tokens": view.hard_limit_tokens,
    }
    return _json.dumps(budget)
