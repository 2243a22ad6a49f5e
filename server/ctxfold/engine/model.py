"""Domain types of the canonical transcript and the session configuration."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass

from ctxfold.engine.errors import invalid

SAFETY_MARGIN_TOKENS = 256
# The defaults of the session config, written once: the dataclass, `resolve_config` and the replay use them.
DEFAULT_COMPACT_RATIO = 0.80
# The recent tail a fold keeps verbatim: 0.08 of the window was 2-10 % cheaper than 0.16 over the
# recorded traces at 16k and 32k under the three price sheets, every probe (task, instructions, paths,
# reachable results) unchanged (`ctxfold replay --tail-ratio`, docs/architecture.md).
DEFAULT_TAIL_RATIO = 0.08
DEFAULT_SUMMARY_MAX_TOKENS = 8192
DEFAULT_TOOL_CONTENT_MAX_BYTES = 32768
MAX_KEY_CHARS = 256  # prompt_cache_key and model


class Role(enum.Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Author(enum.Enum):
    """Who wrote a user-role message, as its caller states it; `UNSTATED` leaves it to the rules of
    `engine/authorship.py`."""

    UNSTATED = ""
    PERSON = "person"
    MACHINE = "machine"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ProviderPayload:
    """What a provider's message carried beyond the canonical fields, kept verbatim for the client
    that wrote it (the gateway): the engine never reads `json`; `tokens` is added to the message's
    estimate."""

    format: str
    json: str = ""
    fingerprint: str = ""
    tokens: int = 0


@dataclass(frozen=True)
class NewMessage:
    """A message as an agent appends it, before it is bounded and stored."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    reasoning_content: str = ""
    pinned: bool = False
    name: str = ""
    payload: ProviderPayload | None = None
    author: Author = Author.UNSTATED


@dataclass(frozen=True)
class StoredMessage:
    """A canonical message. `content` is the provider-visible (bounded) text; for a tool result whose
    raw text was longer, `result_ref` names the stored raw result and `truncated` is set."""

    id: str
    seq: int
    role: Role
    content: str
    tokens: int
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    reasoning_content: str = ""
    pinned: bool = False
    name: str = ""
    result_ref: str = ""
    raw_bytes: int = 0
    truncated: bool = False
    create_time: float = 0.0
    abandoned: bool = False
    payload: ProviderPayload | None = None
    author: Author = Author.UNSTATED


def text_chars(messages: Sequence[NewMessage | StoredMessage]) -> int:
    """The characters of text `messages` carry (what tokenizing, building and serializing them costs)."""
    return sum(
        len(m.content)
        + len(m.reasoning_content)
        + sum(len(c.arguments) for c in m.tool_calls)
        + (len(m.payload.json) if m.payload else 0)
        for m in messages
    )


@dataclass(frozen=True)
class SessionConfig:
    """Per-session settings with their defaults filled in (see `resolve_config`)."""

    context_window: int
    compact_ratio: float = DEFAULT_COMPACT_RATIO
    tail_ratio: float = DEFAULT_TAIL_RATIO
    max_output_tokens: int = 0
    summary_max_tokens: int = DEFAULT_SUMMARY_MAX_TOKENS
    tool_content_max_bytes: int = DEFAULT_TOOL_CONTENT_MAX_BYTES
    system_prompt: str = ""
    tools_json: str = ""
    summarizer: str = "extractive"
    cache_ttl_seconds: int = 0
    prompt_cache_key: str = ""
    model: str = ""
    disable_task_anchor: bool = False
    # 0: no background folds (the default of sessions written before they existed).
    prefold_ratio: float = 0.0

    @property
    def trigger_tokens(self) -> int:
        return int(self.compact_ratio * self.context_window)

    @property
    def prefold_tokens(self) -> int:
        """Where a fold starts in the background (0: never); below `trigger_tokens`."""
        return int(self.prefold_ratio * self.context_window)

    @property
    def hard_limit_tokens(self) -> int:
        """The hard ceiling of a request's input: what the provider accepts beside the reserved output."""
        return self.context_window - self.max_output_tokens - SAFETY_MARGIN_TOKENS

    def above_ceiling(self, tokens: int) -> bool:
        """Whether a request estimate (`Projection.tokens()`, which holds the reserved output already) is
        above the hard ceiling of its input. The output is reserved once, so the ceiling never falls
        below the trigger, where a view would fail with no fold tried."""
        return tokens - self.max_output_tokens > self.hard_limit_tokens


@dataclass(frozen=True)
class ConfigInput:
    """A config as received: zero values mean "default"."""

    context_window: int = 0
    compact_ratio: float = 0.0
    tail_ratio: float = 0.0
    max_output_tokens: int = 0
    summary_max_tokens: int = 0
    tool_content_max_bytes: int = 0
    system_prompt: str = ""
    tools_json: str = ""
    summarizer: str = ""
    cache_ttl_seconds: int = 0
    prompt_cache_key: str = ""
    model: str = ""
    disable_task_anchor: bool = False
    # None: the default (on for a summarizer that calls a model); 0 turns background folds off.
    prefold_ratio: float | None = None


MIN_TOOL_CONTENT_BYTES = 4096
MAX_TOOL_CONTENT_BYTES = 1 << 20
MAX_CONTEXT_WINDOW = 100_000_000
# The smallest window with room for a view, a summary and the safety margin at the default ratio.
MIN_CONTEXT_WINDOW = 1000
MAX_SYSTEM_PROMPT_BYTES = 1 << 20
# Tool schemas nest a few levels; anything deeper than this is refused.
MAX_JSON_DEPTH = 64
MAX_TOOLS_JSON_BYTES = 1 << 20
MAX_NAME_CHARS = 128


# A background fold starts this far below the trigger (as a share of the window) by default. Late
# enough that few summaries are made for a trigger a prune meets or a session that ends first; a turn
# that jumps past the band is folded in the background at the trigger all the same. On the recorded
# traces, 0.05 cost what folds at the trigger cost (within 1 %, both with the default tail), where
# 0.10 was up to 12 % dearer on one trace; docs/architecture.md, "Background folds", has the command.
PREFOLD_LEAD = 0.05
MIN_PREFOLD_RATIO = 0.10
# The summarizer that runs in-process: it answers at once, so a fold with it never waits in the background.
IN_PROCESS_SUMMARIZER = "extractive"


MIN_SUMMARY_MAX_TOKENS = 256


def default_summary_max(window: int) -> int:
    return max(MIN_SUMMARY_MAX_TOKENS, min(DEFAULT_SUMMARY_MAX_TOKENS, window // 8))


def json_depth(value: object) -> int:
    """How deeply a parsed JSON value nests (a scalar is 0), without recursion."""
    deepest = 0
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            pending.extend((child, depth + 1) for child in item)
    return deepest


def _bad(field_name: str, why: str) -> Exception:
    return invalid("INVALID_CONFIG", f"config.{field_name}: {why}", field=field_name)


def _check_window(window: int) -> None:
    if window <= 0:
        raise _bad("context_window", "is required and must be > 0")
    if window > MAX_CONTEXT_WINDOW:
        raise _bad("context_window", f"must be at most {MAX_CONTEXT_WINDOW}")
    if window < MIN_CONTEXT_WINDOW:
        # Said here, not as a max_output_tokens or summary_max_tokens error further down.
        raise _bad("context_window", f"must be at least {MIN_CONTEXT_WINDOW} tokens, got {window}")


def _check_fits_below_trigger(trigger: int, max_output: int, summary_max: int) -> None:
    """The reserved output and a whole summary must fit below the trigger, with the safety margin."""
    if max_output + SAFETY_MARGIN_TOKENS >= trigger:
        raise _bad(
            "max_output_tokens",
            f"{max_output} output tokens plus the {SAFETY_MARGIN_TOKENS}-token margin do not fit "
            f"below the trigger of {trigger} tokens (compact_ratio × context_window)",
        )
    if summary_max + max_output + SAFETY_MARGIN_TOKENS > trigger:
        raise _bad(
            "summary_max_tokens",
            f"a {summary_max}-token summary plus {max_output} output tokens and the {SAFETY_MARGIN_TOKENS}-token "
            f"margin do not fit below the trigger of {trigger} tokens",
        )


def _check_tools(tools_json: str) -> None:
    if not tools_json:
        return
    if len(tools_json.encode()) > MAX_TOOLS_JSON_BYTES:
        raise _bad("tools_json", f"must be at most {MAX_TOOLS_JSON_BYTES} bytes")
    try:
        tools = json.loads(tools_json)
    except ValueError as exc:
        raise _bad("tools_json", f"is not valid JSON ({exc})") from None
    except RecursionError:
        raise _bad("tools_json", f"nests deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(tools, list):
        raise _bad("tools_json", "must be a JSON array of tool schemas")
    if json_depth(tools) > MAX_JSON_DEPTH:
        # Providers' SDKs walk the schemas recursively: a deep one would fail every fold.
        raise _bad("tools_json", f"nests deeper than {MAX_JSON_DEPTH} levels")


def _prefold_ratio(given: float | None, summarizer: str, ratio: float) -> float:
    """Unset: compact_ratio − PREFOLD_LEAD for a summarizer that calls a model, off for the in-process
    one; else 0 (off) or within [MIN_PREFOLD_RATIO, compact_ratio)."""
    if given is None:
        return 0.0 if summarizer == IN_PROCESS_SUMMARIZER else round(ratio - PREFOLD_LEAD, 4)
    if given != 0.0 and not MIN_PREFOLD_RATIO <= given < ratio:
        raise _bad(
            "prefold_ratio", f"must be 0 (off) or within [{MIN_PREFOLD_RATIO}, compact_ratio {ratio}), got {given}"
        )
    return given


def resolve_config(given: ConfigInput, summarizers: frozenset[str], session_id: str) -> SessionConfig:
    """Fills defaults and validates; raises INVALID_ARGUMENT (reason INVALID_CONFIG) naming the field.
    The default prompt cache key is the session's own, stable for its life, so every request of it
    lands on the same provider cache."""
    window = given.context_window
    _check_window(window)
    ratio = given.compact_ratio or DEFAULT_COMPACT_RATIO
    if not 0.30 <= ratio <= 0.95:
        raise _bad("compact_ratio", f"must be within [0.30, 0.95], got {ratio}")
    tail = given.tail_ratio or DEFAULT_TAIL_RATIO
    if not 0.0 < tail <= 0.5:
        raise _bad("tail_ratio", f"must be within (0, 0.5], got {tail}")
    for name in ("max_output_tokens", "summary_max_tokens", "cache_ttl_seconds"):
        if getattr(given, name) < 0:
            raise _bad(name, "must be >= 0")
    summary_max = given.summary_max_tokens or default_summary_max(window)
    tool_max = given.tool_content_max_bytes or DEFAULT_TOOL_CONTENT_MAX_BYTES
    if not MIN_TOOL_CONTENT_BYTES <= tool_max <= MAX_TOOL_CONTENT_BYTES:
        raise _bad(
            "tool_content_max_bytes",
            f"must be within [{MIN_TOOL_CONTENT_BYTES}, {MAX_TOOL_CONTENT_BYTES}], got {tool_max}",
        )
    _check_fits_below_trigger(int(ratio * window), given.max_output_tokens, summary_max)
    if len(given.system_prompt.encode()) > MAX_SYSTEM_PROMPT_BYTES:
        raise _bad("system_prompt", f"must be at most {MAX_SYSTEM_PROMPT_BYTES} bytes")
    _check_tools(given.tools_json)
    summarizer = given.summarizer or IN_PROCESS_SUMMARIZER
    if summarizer not in summarizers:
        raise _bad("summarizer", f"unknown summarizer {summarizer!r}; configured: {', '.join(sorted(summarizers))}")
    for name in ("prompt_cache_key", "model"):
        if len(getattr(given, name)) > MAX_KEY_CHARS:
            raise _bad(name, f"must be at most {MAX_KEY_CHARS} characters")
    return SessionConfig(
        context_window=window,
        compact_ratio=ratio,
        tail_ratio=tail,
        max_output_tokens=given.max_output_tokens,
        summary_max_tokens=summary_max,
        tool_content_max_bytes=tool_max,
        system_prompt=given.system_prompt,
        tools_json=given.tools_json,
        summarizer=summarizer,
        cache_ttl_seconds=given.cache_ttl_seconds,
        prompt_cache_key=given.prompt_cache_key or f"ctxfold-{session_id}",
        model=given.model,
        disable_task_anchor=given.disable_task_anchor,
        prefold_ratio=_prefold_ratio(given.prefold_ratio, summarizer, ratio),
    )


# The settings every config carries: ConfigInput and SessionConfig (and the API's SessionConfig) share them.
CONFIG_FIELDS = tuple(ConfigInput.__dataclass_fields__)


def override_config(base: SessionConfig, overrides: ConfigInput) -> ConfigInput:
    """A fork's config: the source's values, replaced by every non-zero override (`prefold_ratio`: by
    every one given, 0 included)."""
    values = {name: getattr(overrides, name) or getattr(base, name) for name in CONFIG_FIELDS}
    values["prefold_ratio"] = base.prefold_ratio if overrides.prefold_ratio is None else overrides.prefold_ratio
    return ConfigInput(**values)


def config_to_json(config: SessionConfig) -> str:
    return json.dumps(config.__dict__, sort_keys=True)


def config_from_json(text: str) -> SessionConfig:
    data = json.loads(text)
    known = {k: v for k, v in data.items() if k in SessionConfig.__dataclass_fields__}
    return SessionConfig(**known)


@dataclass(frozen=True)
class Usage:
    """A provider's reported usage for one request built from view `view_version`."""

    view_version: int
    estimated_tokens: int  # ctxfold's estimate of that view (filled in when recorded)
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    finish_reason: str
