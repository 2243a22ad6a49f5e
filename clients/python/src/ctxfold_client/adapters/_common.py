"""What the three adapters share: the reply type and reading a response given as a dict or as an
official SDK object."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from ctxfold_client._gen.enums import ErrorReason
from ctxfold_client.errors import CtxfoldError
from ctxfold_client.models import Message, Usage, View


class SupportsModelDump(Protocol):
    """A response object of the `openai` or `anthropic` SDK (a pydantic model)."""

    def model_dump(self) -> dict[str, Any]: ...


Response = Mapping[str, Any] | SupportsModelDump


@dataclass(frozen=True, slots=True)
class ProviderTurn:
    """A provider response as ctxfold sees it: the messages to append (the assistant message with
    its tool calls; their results follow from the agent's tools) and the usage to report."""

    messages: tuple[Message, ...]
    usage: Usage


def as_mapping(response: Response) -> Mapping[str, Any]:
    return response if isinstance(response, Mapping) else response.model_dump()


def view_messages(view: View | Sequence[Message]) -> Sequence[Message]:
    return view.messages if isinstance(view, View) else view


def unconvertible(message: str) -> CtxfoldError:
    """What an adapter raises for a message or response it cannot convert."""
    return CtxfoldError.client(grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_MESSAGE, message)


def items(value: object) -> Iterable[Mapping[str, Any]]:
    """A JSON list of objects (null and absent read as empty)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise unconvertible(f"expected a JSON list, not {type(value).__name__}")
    return [item for item in value if isinstance(item, Mapping)]


def fields(value: object) -> Mapping[str, Any]:
    """A JSON object; anything else (null, absent, a value of another type) reads as empty, as in the
    other SDKs."""
    return value if isinstance(value, Mapping) else {}


def count(value: object) -> int:
    """A token count (null and absent read as 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def join(parts: Iterable[str]) -> str:
    return "\n".join(part for part in parts if part)
