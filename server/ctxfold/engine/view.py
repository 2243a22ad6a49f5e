"""The provider-visible view: system + at most one summary + kept messages + the messages after the
checkpoint position, with pruned tool results shown as head + marker + tail.

Everything here is pure and works from stored token counts: building a view never re-tokenizes
history. Only a newly pruned result or a new summary is tokenized, once, when it is made."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ctxfold.engine import estimator
from ctxfold.engine.authorship import invokes_command, is_action_output, is_text_action
from ctxfold.engine.briefing import FoldNotes
from ctxfold.engine.model import ProviderPayload, Role, SessionConfig, StoredMessage

PRUNE_MIN_CODE_POINTS = 8192
PRUNE_HEAD_CODE_POINTS = 4096
PRUNE_TAIL_CODE_POINTS = 1024
TAIL_MAX_TOKENS = 32000
# The task anchor shows at most min(this share of the window, ANCHOR_MAX_TOKENS) verbatim.
ANCHOR_WINDOW_SHARE = 0.25
ANCHOR_MAX_TOKENS = 8000
# Of a bounded anchor, the head keeps this share (the ask is usually stated first).
ANCHOR_HEAD_SHARE = 0.75
# The opening ends after this many user messages: a session that takes in many before its first answer
# (a channel bot, an imported chat) kept them all as anchors, which no fold shrinks (1,500 at a 32k
# window: every Prepare failed). Recorded agents open with one or two.
MAX_OPENING_USER_MESSAGES = 8
EMPTY: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True)
class Checkpoint:
    """A committed fold: messages up to `position_seq` are represented by `summary` plus the kept
    messages `kept_ids` (in seq order); messages after the position follow verbatim."""

    id: str
    parent_id: str | None
    position_seq: int
    summary: str
    summary_tokens: int
    kept_ids: tuple[str, ...]
    notes: FoldNotes | None = None  # None for checkpoints written before folds kept notes
    # The provider's own compaction item (native compaction), re-emitted with the summary message.
    native: ProviderPayload | None = None


@dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint as an operator reads it back."""

    checkpoint: Checkpoint
    create_time: float
    on_head_chain: bool  # the session's head checkpoint is this one or descends from it


@dataclass(frozen=True)
class ViewMessage:
    role: Role
    content: str
    tokens: int
    source: StoredMessage | None = None  # the canonical message rendered; None for system prompt and summary
    summary: bool = False
    pruned: bool = False  # shown as head + marker + tail (a pruned result, a bounded anchor)
    payload: ProviderPayload | None = None  # the summary's native compaction item


def prune_stub(content: str, result_ref: str) -> str:
    """Head 4096 + marker + tail 1024 code points of an old, large tool result."""
    omitted = len(content) - PRUNE_HEAD_CODE_POINTS - PRUNE_TAIL_CODE_POINTS
    marker = (
        f"\n\n[ctxfold: pruned {omitted} characters of an old tool result; "
        f'read it in full with ReadToolResult(result_ref="{result_ref}")]\n\n'
    )
    return content[:PRUNE_HEAD_CODE_POINTS] + marker + content[-PRUNE_TAIL_CODE_POINTS:]


def bound_stub(content: str, result_ref: str, keep: int) -> str:
    """A tool result the view could not hold whole, as `keep` code points (its head, and a fifth of
    them from its tail, where errors and summaries are) around a marker naming where all of it is read."""
    tail = keep // 5
    head = keep - tail
    marker = (
        f"\n\n[ctxfold: {len(content) - keep} characters of this tool result left out so that the view fits "
        f'the context window; read it in full with ReadToolResult(result_ref="{result_ref}")]\n\n'
    )
    return content[:head] + marker + (content[-tail:] if tail else "")


def result_ids(messages: Sequence[StoredMessage], mode: str) -> set[str]:
    """The ids of the results among `messages`: tool results, and in a session acting in text (`mode`)
    the user messages holding its commands' output (a tool result in all but its role)."""
    previous = [None, *messages][: len(messages)]
    return {
        m.id
        for before, m in zip(previous, messages, strict=True)
        if m.role is Role.TOOL or is_action_output(m, before, mode)
    }


def prunable(message: StoredMessage, results: set[str]) -> bool:
    return message.id in results and len(message.content) > PRUNE_MIN_CODE_POINTS


def system_message(config: SessionConfig, system_tokens: int) -> list[ViewMessage]:
    return [ViewMessage(Role.SYSTEM, config.system_prompt, system_tokens)] if config.system_prompt else []


def summary_message(checkpoint: Checkpoint | None) -> list[ViewMessage]:
    if checkpoint is None:
        return []
    return [
        ViewMessage(Role.USER, checkpoint.summary, checkpoint.summary_tokens, summary=True, payload=checkpoint.native)
    ]


def opening_end(messages: Sequence[StoredMessage], config: SessionConfig) -> int:
    """The seq of the last message of the opening — the system and user messages before the agent's
    first answer (the task, and whatever else the person sent with it), at most
    `MAX_OPENING_USER_MESSAGES` user messages. With the task anchor disabled only an opening system
    message counts."""
    end, users = 0, 0
    limit = 0 if config.disable_task_anchor else MAX_OPENING_USER_MESSAGES
    for message in messages:
        if message.role is Role.ASSISTANT or message.role is Role.TOOL or message.seq != end + 1:
            break
        if message.role is Role.USER:
            if users == limit:
                break
            users += 1
        end = message.seq
    return end


def anchor_limit(config: SessionConfig) -> int:
    return min(int(config.context_window * ANCHOR_WINDOW_SHARE), ANCHOR_MAX_TOKENS)


def _within_tokens(text: str, limit: int, from_end: bool) -> str:
    """The start (or end) of `text`: three characters per token of `limit` (within it for prose and code), fewer
    where that is above `limit` tokens (Chinese: about one character a token), found in a few proportional steps."""
    chars = min(len(text), limit * 3)
    while chars > 0:
        piece = text[len(text) - chars :] if from_end else text[:chars]
        tokens = estimator.count_text(piece)
        if tokens <= limit:
            return piece
        chars = min(chars - 1, int(chars * limit / tokens))
    return ""


@functools.lru_cache(maxsize=256)
def bounded_anchor(content: str, result_ref: str, limit_tokens: int) -> tuple[str, int]:
    """An opening message too large for the anchor: its head and tail around a marker naming where
    all of it is read, within `limit_tokens` (the marker alone when the limit holds no more). Tokenized a
    few times per (content, limit) in a process."""
    where = f'ReadToolResult(result_ref="{result_ref}")' if result_ref else "ListMessages"
    text = _head_and_tail(content, where, limit_tokens)
    if (tokens := estimator.count_text(text)) > limit_tokens:  # head and tail fill it (Chinese): the marker's room
        marker_tokens = estimator.count_text(_omitted(len(content), where))
        text = _head_and_tail(content, where, max(0, limit_tokens - marker_tokens - 4))  # 4: the joins
        tokens = estimator.count_text(text)
    return text, tokens


def _head_and_tail(content: str, where: str, room: int) -> str:
    head_room = int(room * ANCHOR_HEAD_SHARE)
    head = _within_tokens(content, head_room, from_end=False)
    tail = _within_tokens(content[len(head) :], room - head_room, from_end=True)
    marker = _omitted(len(content) - len(head) - len(tail), where)
    return "\n\n".join(part for part in (head, marker, tail) if part)


def _omitted(chars: int, where: str) -> str:
    return f"[ctxfold: {chars} characters of this message omitted; read all of it with {where}]"


def render(
    message: StoredMessage, pruned: Mapping[str, int], anchor_tokens: int = 0, bounds: Mapping[str, int] = EMPTY
) -> ViewMessage:
    """`anchor_tokens` > 0 renders an opening user message bounded to that many tokens; `bounds` are the
    results bounded to fit the window (message id -> code points kept), each also in `pruned`."""
    stub_tokens = pruned.get(message.id)
    if stub_tokens is not None:
        keep = bounds.get(message.id)
        text = prune_stub(message.content, message.result_ref)
        if keep is not None:
            text = bound_stub(message.content, message.result_ref, keep)
        return ViewMessage(message.role, text, stub_tokens, message, pruned=True)
    if anchor_tokens and message.role is Role.USER and message.tokens > anchor_tokens:
        text, tokens = bounded_anchor(message.content, message.result_ref, anchor_tokens)
        return ViewMessage(message.role, text, tokens, message, pruned=True)
    return ViewMessage(message.role, message.content, message.tokens, message)


def build_view(
    config: SessionConfig,
    system_tokens: int,
    checkpoint: Checkpoint | None,
    kept: Sequence[StoredMessage],
    after: Sequence[StoredMessage],
    pruned: Mapping[str, int],
    anchor_end: int = 0,
    bounds: Mapping[str, int] = EMPTY,
) -> list[ViewMessage]:
    """System, the opening anchors (messages up to seq `anchor_end`), the summary, then the other
    kept messages and those after the checkpoint: the anchors stay in the stable prefix across folds."""
    messages = [*kept, *after]
    anchors = [m for m in messages if m.seq <= anchor_end]
    limits = anchor_shares([m for m in anchors if m.role is Role.USER], anchor_limit(config))
    head = system_message(config, system_tokens) + [render(m, pruned, limits.get(m.id, 0), bounds) for m in anchors]
    later = [render(m, pruned, 0, bounds) for m in messages if m.seq > anchor_end]
    return head + summary_message(checkpoint) + later


def anchor_shares(opening: Sequence[StoredMessage], limit: int) -> dict[str, int]:
    """Each opening user message's share of the anchor limit: small messages take what they need,
    the large ones split the rest evenly."""
    shares: dict[str, int] = {}
    left = limit
    by_size = sorted(opening, key=lambda m: m.tokens)
    for index, message in enumerate(by_size):
        shares[message.id] = max(1, min(message.tokens, left // (len(by_size) - index)))
        left -= shares[message.id]
    return shares


def estimate(view: Sequence[ViewMessage], tools_tokens: int, config: SessionConfig, calibration: float) -> int:
    return estimator.request_tokens(
        sum(v.tokens for v in view), len(view), tools_tokens, config.max_output_tokens, calibration
    )


def call_groups(messages: Sequence[StoredMessage], mode: str) -> list[list[StoredMessage]]:
    """Messages split into units that are never separated: an assistant message with tool calls and
    its results form one group, as do, in a session acting in text (`mode`, see
    `engine/authorship.py`), an assistant message acting by a fenced command block and the user
    message holding its output, and a slash-command invocation and the prompt it expands to; every
    other message is a group of its own."""
    groups: list[list[StoredMessage]] = []
    for message in messages:
        answers_call = message.role is Role.TOOL and bool(groups) and bool(groups[-1][0].tool_calls)
        single = groups[-1][0] if groups and len(groups[-1]) == 1 else None
        answers_action = message.role is Role.USER and single is not None and is_text_action(single, mode)
        expands_command = message.role is Role.USER and single is not None and invokes_command(single)
        if answers_call or answers_action or expands_command:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


def group_tokens(group: Sequence[StoredMessage], pruned: Mapping[str, int]) -> int:
    return sum(render(m, pruned).tokens + estimator.PER_MESSAGE_TOKENS for m in group)


def tail_budget(config: SessionConfig, system_tokens: int, tools_tokens: int) -> int:
    """min(tail_ratio × window, 32000, headroom / 4): headroom is the window outside the system
    prompt, the tool schemas and the reserved output."""
    headroom = config.context_window - system_tokens - tools_tokens - config.max_output_tokens
    return max(0, min(int(config.tail_ratio * config.context_window), TAIL_MAX_TOKENS, headroom // 4))


def recent_tail(
    messages: Sequence[StoredMessage], budget: int, pruned: Mapping[str, int], mode: str
) -> list[StoredMessage]:
    """The newest complete call groups that fit `budget`, stopping at the first that does not."""
    tail: list[list[StoredMessage]] = []
    used = 0
    for group in reversed(call_groups(messages, mode)):
        cost = group_tokens(group, pruned)
        if used + cost > budget:
            break
        tail.append(group)
        used += cost
    return [m for group in reversed(tail) for m in group]


def prune_candidates(
    messages: Sequence[StoredMessage], tail: Sequence[StoredMessage], pruned: Mapping[str, int], mode: str
) -> list[StoredMessage]:
    """Large results (`result_ids`) outside the recent tail that are not pruned yet."""
    in_tail, results = {m.id for m in tail}, result_ids(messages, mode)
    return [m for m in messages if prunable(m, results) and m.id not in in_tail and m.id not in pruned]


@dataclass(frozen=True)
class FoldSplit:
    """What one fold keeps verbatim and what it summarizes."""

    kept: list[StoredMessage]
    folded: list[StoredMessage]


def _awaits_results(group: Sequence[StoredMessage]) -> bool:
    """Whether a call group's tool calls are not all answered within it."""
    called = {c.id for m in group for c in m.tool_calls}
    return not called <= {m.tool_call_id for m in group if m.role is Role.TOOL}


def split_fold(
    messages: Sequence[StoredMessage], tail: Sequence[StoredMessage], anchor_end: int, mode: str, ahead: bool = False
) -> FoldSplit:
    """Keeps the opening anchors (an opening system message — agents that do not set `system_prompt`
    in the config send it that way — and the task, messages up to seq `anchor_end`), pinned
    messages, the input the next call must answer (the last user message and the newest call group,
    which may still await results) and `tail`; folds the rest, later system messages (per-turn
    reminders) included. Call groups are kept or folded whole. A fold made `ahead` of its install
    (in the background) folds the newest call group too when it awaits no results: by the install,
    later calls answer it."""
    in_tail = {m.id for m in tail}
    last_user = next((m.id for m in reversed(messages) if m.role is Role.USER), None)
    groups = call_groups(messages, mode)
    newest_open = bool(groups) and _awaits_results(groups[-1])
    kept_groups: list[list[StoredMessage]] = []
    folded: list[StoredMessage] = []
    for index, group in enumerate(groups):
        anchor = group[0]
        keep = (
            (index == len(groups) - 1 and (newest_open or not ahead))
            or anchor.id in in_tail
            or anchor.seq <= anchor_end
            or (anchor.role is Role.SYSTEM and anchor.seq == 1)
            or anchor.id == last_user
            or any(m.pinned for m in group)
        )
        if keep:
            kept_groups.append(group)
        else:
            folded.extend(group)
    return FoldSplit(kept=[m for g in kept_groups for m in g], folded=folded)
