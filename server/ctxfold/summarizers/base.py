"""The summarizer protocol: turn the folded part of a view into one durable resume briefing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import httpx2
import pydantic
from opentelemetry import trace

from ctxfold.engine.model import ProviderPayload
from ctxfold.engine.view import ViewMessage

# The sections a summarizer writes. The standing instructions, the artifact index and the
# folded-results index are rendered by the engine around them (ctxfold.engine.briefing).
SECTIONS = (
    "Goal",
    "Decisions",
    "Files & code",
    "Commands & outcomes",
    "Errors & fixes",
    "Pending & next step",
)

INSTRUCTIONS = (
    "Write a durable resume briefing of the conversation above so that work can continue from it alone. "
    "Use exactly these sections, as '## ' headings: " + "; ".join(SECTIONS) + ". Keep identifiers, paths, "
    "commands and numbers exactly as written and say where the work stands. Do not write the person's "
    "instructions, an artifact list or tool-result references: ctxfold adds those itself, verbatim."
)


class SummarizerError(Exception):
    """The summarizer could not produce a summary; the message says why."""


# The whole of one summarizer call (retries included) ends by this deadline: a provider that keeps
# the connection alive without finishing cannot hold a fold, its session and its lease for longer.
DEFAULT_DEADLINE_SECONDS = 180.0
# No real text takes more bytes than this per token, so a summary past max_tokens × this many bytes
# is certainly too long: reading stops there (before it is buffered, streamed or tokenized whole).
MAX_BYTES_PER_TOKEN = 32


@contextlib.asynccontextmanager
async def deadline(seconds: float) -> AsyncIterator[None]:
    """Cancels what runs inside after `seconds` and says so as a SummarizerError."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise SummarizerError(f"no complete summary within the deadline of {seconds:g} s (deadline_seconds)") from None


T = TypeVar("T")


def parsed(shape: pydantic.TypeAdapter[T], data: bytes | str, provider: str, what: str) -> T:
    """`data` (JSON) read as `shape`, validated field by field: the provider SDKs build their answer
    objects without validating them, so a 200 answer of another shape would otherwise fail later as a
    Python internal. Raises a SummarizerError that names the provider, `what` and the first bad field."""
    try:
        return shape.validate_json(data)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        first = errors[0]
        where = ".".join(str(part) for part in first["loc"]) or "its JSON"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        head = data[:80] if isinstance(data, bytes) else data[:80].encode()
        raise SummarizerError(
            f"{provider}: {what} is malformed: {where}: {first['msg']}{more}; it starts {head!r}"
        ) from None


class StreamedAnswer(Protocol):
    """What both provider SDKs' raw streamed responses offer (`with_streaming_response`)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def iter_lines(self) -> AsyncIterator[str]: ...

    async def read(self) -> bytes: ...


async def event_data(answer: StreamedAnswer, provider: str) -> AsyncIterator[tuple[str, str]]:
    """The (event name, data) of each server-sent event of a streamed answer; a 200 answer that is not
    an event stream is refused with a SummarizerError naming the provider and what came instead."""
    content_type = answer.headers.get("content-type", "")
    if not content_type.startswith("text/event-stream"):
        head = (await answer.read())[:80]
        raise SummarizerError(
            f"{provider}: the answer is not an event stream but {content_type or 'untyped'}: it starts {head!r}"
        )
    name, data = "", list[str]()
    lines = answer.iter_lines()
    while True:
        try:
            line = await anext(lines)
        except StopAsyncIteration:
            break
        except httpx2.TimeoutException:
            # Read outside the SDK's own stream wrapper, so its transport errors arrive as they are.
            raise SummarizerError(f"{provider}: the answer stream timed out between reads") from None
        except httpx2.TransportError as exc:
            raise SummarizerError(f"{provider}: the answer stream broke off ({type(exc).__name__}: {exc})") from None
        if not line:
            if data:
                yield name, "\n".join(data)
            name, data = "", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield name, "\n".join(data)


class OutputBound:
    """Counts the bytes of a summary as they arrive; raises SummarizerError once they pass what
    `max_tokens` tokens can take."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.limit = max(max_tokens, 1) * MAX_BYTES_PER_TOKEN
        self.size = 0

    def add(self, size: int) -> None:
        self.size += size
        if self.size > self.limit:
            raise SummarizerError(
                f"the summary passed {self.limit} bytes, far more than {self.max_tokens} tokens; reading stopped"
            )


@dataclass(frozen=True)
class SummaryRequest:
    """A cache-safe fork of the agent's request: its system prompt, tools and cache key, and the view
    exactly as the agent sends it up to the last folded message (`prefix`, which starts with the
    system message and the previous summary when there are ones); the instruction follows."""

    system_prompt: str
    tools_json: str
    prompt_cache_key: str
    # The previous summary's sections (its body, without the parts the engine renders): updated, not nested.
    previous_summary: str
    prefix: Sequence[ViewMessage]
    folded: Sequence[ViewMessage]  # the messages of `prefix` this summary replaces
    max_tokens: int
    focus: str = ""
    # The agent sends max_tokens itself (max_output_tokens > 0); a fork that mirrors it sends one too.
    send_max_tokens: bool = True

    def instruction(self) -> str:
        text = INSTRUCTIONS + f" Stay within {self.max_tokens} tokens."
        if self.previous_summary:
            text += (
                " The earlier summary above holds these sections already: update them section by section with "
                "the newer messages, keep what still matters, and do not nest or quote the earlier summary."
            )
        return text + (f"\n\nFocus: {self.focus}" if self.focus else "")


@dataclass(frozen=True)
class SummaryResult:
    text: str
    finish_reason: str  # "stop" when complete; "length" marks a truncated summary, which is rejected
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    response_model: str = ""  # the model that answered, as the provider names it
    response_id: str = ""  # the provider's id of its answer
    # The provider's own compaction item (`summarizers/native.py`); `text` is then its text, if any.
    native: ProviderPayload | None = None
    # Why native compaction was asked for and this is the application summary instead ("" otherwise).
    native_fallback: str = ""


OnDelta = Callable[[str], Awaitable[None]]


# The provider of summarizers that run in the server and call no model (extractive).
IN_PROCESS_PROVIDER = "ctxfold"


class Summarizer(Protocol):
    name: str
    provider: str  # for telemetry (gen_ai.provider.name): "openai", "anthropic", IN_PROCESS_PROVIDER
    model: str
    server_address: str  # the provider's host, for telemetry; "" in process
    server_port: int  # its port; 0 in process
    # The largest fold input (tokens) one summary request can read; larger folds run in passes.
    input_window_tokens: int

    async def summarize(self, request: SummaryRequest, on_delta: OnDelta | None = None) -> SummaryResult: ...


async def _attempt_answered(response: httpx2.Response) -> None:
    """One HTTP attempt of a summary request, as an event on the summarizer's span: the official
    SDKs retry inside one call (`max_retries`), and each attempt shows with its status."""
    trace.get_current_span().add_event(
        "ctxfold.summarizer.attempt", {"http.response.status_code": response.status_code}
    )


# The event hooks of the SDKs' HTTP client: every attempt of a summary request leaves an event.
ATTEMPT_HOOKS: dict[str, list[Callable[[httpx2.Response], Awaitable[None]]]] = {"response": [_attempt_answered]}
