"""Baseline context policies, pure: what other agents do with a growing conversation, run over the
same recorded turns and the same simulated provider as ctxfold.

* `FullHistory`: everything, every time (no window): the reference cost and the cache's best case.
* `Truncate`: no compaction; the oldest call groups are dropped until the request fits the window.
* `SummarizeAll`: at the trigger, the whole history (but the newest call group, which the next call
  must answer) is replaced by one summary, like common CLI agents' auto-compact. The summary request
  is a cache-safe fork: the current view plus an instruction, with the agent's cache key. With
  `keep_user_messages` the summary also quotes every message the person typed, verbatim and oldest
  first, as Claude Code's compaction asks its summarizer to ("all user messages").
* `ContextEditing`: Anthropic's `clear_tool_uses` context edit: when the view reaches the trigger,
  the content of every tool result but the newest `keep` (3) is replaced by a placeholder, but only
  when that frees at least `clear_at_least` tokens (so the cache is not broken for a small gain);
  with `clear_tool_inputs` (on: the stronger setting on these traces, whose calls carry whole
  scripts) the calls' arguments are cleared too. Cleared stays cleared. If the view still does not
  fit, oldest-first truncation.
* `RollingCondenser`: keeps the first messages and a half-window tail and summarizes what lies
  between whenever the view holds more than `max_events` messages or reaches the trigger, like
  common condenser designs (OpenHands' LLM summarizing condenser). Its summary request is a separate
  prompt (instruction, previous summary, forgotten events) with a cache key of its own.
* `ToolMasking`: observation masking as in "The Complexity Trap" (arXiv 2508.21433): at every call,
  tool outputs older than the newest `keep_recent` (M = 10) are replaced by a placeholder; if the
  view still does not fit, oldest-first truncation.

Tool outputs are what `ctxfold.replay.probes.classify` says they are (role `tool`, or the user
message answering a text action), the same rule the probes score with.

Summaries are `ctxfold.replay.peer_summary`'s fixed, self-contained briefing (not ctxfold's
summarizer, whose output depends on what ctxfold's engine renders around it), so the baselines do
not move when ctxfold changes; they have no store, so their briefings carry no `result_ref`. Token
budgets use ctxfold's own estimator."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ctxfold.engine import estimator
from ctxfold.engine.model import DEFAULT_COMPACT_RATIO, SessionConfig, ToolCall, default_summary_max
from ctxfold.replay import peer_summary, probes
from ctxfold.replay.metrics import AGENT_KEY, ModelCall, Recording, SummaryCall
from ctxfold.replay.trace import Msg, Trace, turns

CONDENSER_KEY = "condenser"
CONDENSER_PROMPT = (
    "You maintain the memory of a software agent. Below are the earlier summary and the events that are "
    "being dropped from its context. Write an updated summary: the user's task and constraints, what was "
    "done and found, files changed, test results, and what remains to do. Keep identifiers exactly."
)
MASK = "[tool output masked]"
CLEARED = "[tool result cleared to save context]"
# The cheapest clear_at_least of 500-12,000 tokens over the recorded traces at windows 16k and 32k.
CLEAR_AT_LEAST_TOKENS = 4000
CLEARED_INPUT = '{"cleared": true}'  # a cleared call's arguments: still valid JSON
USER_MESSAGES_HEADING = "User messages (verbatim, oldest first):"


@dataclass(frozen=True)
class Budget:
    """The same window arithmetic ctxfold uses: trigger = ratio × window, hard ceiling = window −
    max_output_tokens − 256, default summary size max(256, min(8192, window / 8))."""

    window: int
    ratio: float = DEFAULT_COMPACT_RATIO
    max_output_tokens: int = 0
    summary_max_tokens: int = 0

    @property
    def trigger(self) -> int:
        return int(self.ratio * self.window)

    @property
    def config(self) -> SessionConfig:
        """ctxfold's session config of this window arithmetic."""
        return SessionConfig(context_window=self.window, max_output_tokens=self.max_output_tokens)

    @property
    def hard(self) -> int:
        return self.config.hard_limit_tokens

    def above_ceiling(self, tokens: int) -> bool:
        """Whether a request estimate (its output reserved) is above the hard ceiling: ctxfold's rule."""
        return self.config.above_ceiling(tokens)

    @property
    def summary_max(self) -> int:
        return self.summary_max_tokens or default_summary_max(self.window)


@dataclass(frozen=True)
class Step:
    view: tuple[Msg, ...]
    action: str = "none"  # none | folded | pruned | truncated
    summary_calls: tuple[SummaryCall, ...] = ()
    prunes: int = 0  # 1 when tool results were cleared at this step (ContextEditing)


class Policy(Protocol):
    name: str
    settings: dict[str, object]

    def step(self, append: Sequence[Msg]) -> Step: ...

    def over_limit(self, view: Sequence[Msg]) -> bool: ...


@functools.lru_cache(maxsize=65536)
def message_estimate(message: Msg) -> int:
    """ctxfold's per-message estimate (own text, without overhead)."""
    calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in message.tool_calls)
    return estimator.message_tokens(message.content, calls, message.reasoning)


def call_groups(messages: Sequence[Msg]) -> list[list[Msg]]:
    """An assistant message with tool calls and its results stay together."""
    groups: list[list[Msg]] = []
    for message in messages:
        if message.role == "tool" and groups and groups[-1][0].tool_calls:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


class _Base:
    name = "base"

    def __init__(self, trace: Trace, budget: Budget):
        self.trace = trace
        self.budget = budget
        self.system: tuple[Msg, ...] = (Msg("system", trace.system_prompt),) if trace.system_prompt else ()
        self.tools_tokens = estimator.count_text(trace.tools_json)
        self.history: list[Msg] = []
        self.roles = probes.classify(trace)
        self.tool_outputs = self.roles.tool_output
        self.settings: dict[str, object] = {"window": budget.window, "max_output_tokens": budget.max_output_tokens}

    def placeholder(self, message: Msg, text: str) -> Msg:
        """`message` with its content replaced (the rest of the message, and where it came from, kept)."""
        return Msg(message.role, text, tool_call_id=message.tool_call_id, source=message.source, elided=True)

    def estimate(self, view: Sequence[Msg]) -> int:
        return estimator.request_tokens(
            sum(message_estimate(m) for m in view), len(view), self.tools_tokens, self.budget.max_output_tokens
        )

    def over_limit(self, view: Sequence[Msg]) -> bool:
        """The view is above the hard ceiling: nothing this policy may drop would make it fit."""
        return self.budget.window > 0 and self.budget.above_ceiling(self.estimate(view))

    def fit(self, head: Sequence[Msg], body: Sequence[Msg]) -> list[Msg]:
        """`body` without its oldest call groups, until head + body fits the hard ceiling (the newest
        group always stays)."""
        groups = call_groups(body)
        while len(groups) > 1 and self.budget.above_ceiling(self.estimate([*head, *(m for g in groups for m in g)])):
            groups.pop(0)
        return [m for g in groups for m in g]

    def summarize(self, previous: str, folded: Sequence[Msg]) -> str:
        return peer_summary.briefing(
            previous, folded, self.roles, probes.acts_in_text(self.trace), self.budget.summary_max
        )


class FullHistory(_Base):
    name = "full-history"

    def __init__(self, trace: Trace, budget: Budget | None = None):
        super().__init__(trace, budget or Budget(window=0))
        self.settings = {"window": "unlimited"}

    def step(self, append: Sequence[Msg]) -> Step:
        self.history.extend(append)
        return Step((*self.system, *self.history))


class Truncate(_Base):
    name = "truncate"

    def __init__(self, trace: Trace, budget: Budget):
        super().__init__(trace, budget)
        self.start = 0

    def step(self, append: Sequence[Msg]) -> Step:
        self.history.extend(append)
        body = self.fit(self.system, self.history[self.start :])
        dropped = len(self.history) - len(body) - self.start
        self.start += dropped
        return Step((*self.system, *body), "truncated" if dropped else "none")


class SummarizeAll(_Base):
    name = "summarize-all"

    def __init__(self, trace: Trace, budget: Budget, keep_user_messages: bool = False):
        super().__init__(trace, budget)
        self.summary = ""
        self.briefing = ""  # the summary without the quoted user messages: what the next fold rolls in
        self.body: list[Msg] = []
        self.keep_user_messages = keep_user_messages
        self.user_messages: list[str] = []
        if keep_user_messages:
            self.name = "summarize-all, keeps user messages"
        self.settings.update(
            ratio=budget.ratio, summary_max_tokens=budget.summary_max, keep_user_messages=keep_user_messages
        )

    def _summary_text(self, folded: Sequence[Msg]) -> str:
        self.briefing = self.summarize(self.briefing, folded)
        if not self.keep_user_messages:
            return self.briefing
        self.user_messages += [m.content for m in folded if m.source in self.roles.person]
        return "\n\n".join([self.briefing, USER_MESSAGES_HEADING, *self.user_messages])

    def _view(self) -> tuple[Msg, ...]:
        summary = (Msg("user", self.summary, summary=True),) if self.summary else ()
        return (*self.system, *summary, *self.body)

    def step(self, append: Sequence[Msg]) -> Step:
        self.body.extend(append)
        view = self._view()
        groups = call_groups(self.body)
        if self.estimate(view) < self.budget.trigger or len(groups) < 2:
            return Step(view)
        folded = [m for g in groups[:-1] for m in g]
        call_prompt = peer_summary.request(view, self.summary, self.budget.summary_max)
        text = self._summary_text(folded)
        call = SummaryCall(AGENT_KEY, call_prompt, estimator.count_text(text))
        self.summary, self.body = text, groups[-1]
        view = self._view()
        if self.budget.above_ceiling(self.estimate(view)):  # the newest group alone is too large
            self.body = self.fit(view[: len(view) - len(self.body)], self.body)
            view = self._view()
        return Step(view, "folded", (call,))


class RollingCondenser(_Base):
    name = "rolling"

    def __init__(
        self, trace: Trace, budget: Budget, keep_first: int = 1, max_events: int = 100, tail_share: float = 0.5
    ):
        super().__init__(trace, budget)
        self.keep_first = keep_first
        self.max_events = max_events
        self.tail_tokens = int(tail_share * budget.window)
        self.head: list[Msg] = []
        self.summary = ""
        self.body: list[Msg] = []
        self.settings.update(
            ratio=budget.ratio,
            summary_max_tokens=budget.summary_max,
            keep_first=keep_first,
            max_events=max_events,
            tail_tokens=self.tail_tokens,
        )

    def _view(self) -> tuple[Msg, ...]:
        summary = (Msg("user", self.summary, summary=True),) if self.summary else ()
        return (*self.system, *self.head, *summary, *self.body)

    def _tail(self, groups: Sequence[list[Msg]]) -> int:
        """How many of the newest groups make the tail: within half the window and half the events."""
        used = events = count = 0
        for group in reversed(groups):
            cost = sum(message_estimate(m) + estimator.PER_MESSAGE_TOKENS for m in group)
            if count and (used + cost > self.tail_tokens or events + len(group) > self.max_events // 2):
                break
            used, events, count = used + cost, events + len(group), count + 1
        return count

    def step(self, append: Sequence[Msg]) -> Step:
        self.body.extend(append)
        view = self._view()
        events = len(view) - len(self.system)
        if events <= self.max_events and self.estimate(view) < self.budget.trigger:
            return Step(view)
        groups = call_groups(self.body)
        if not self.head and not self.summary:
            self.head = [m for g in groups[: self.keep_first] for m in g]
            groups = groups[self.keep_first :]
        keep = self._tail(groups)
        forgotten = [m for g in groups[: len(groups) - keep] for m in g]
        if not forgotten:
            self.body = [m for g in groups for m in g]
            return Step(self._view())
        text = self.summarize(self.summary, forgotten)
        previous = (Msg("user", f"<PREVIOUS SUMMARY>\n{self.summary}"),) if self.summary else ()
        prompt = (Msg("system", CONDENSER_PROMPT), *previous, *forgotten)
        call = SummaryCall(CONDENSER_KEY, prompt, estimator.count_text(text))
        self.summary = text
        self.body = [m for g in groups[len(groups) - keep :] for m in g]
        view = self._view()
        if self.budget.above_ceiling(self.estimate(view)):
            self.body = self.fit(view[: len(view) - len(self.body)], self.body)
            view = self._view()
        return Step(view, "folded", (call,))


class ToolMasking(_Base):
    name = "masking"

    def __init__(self, trace: Trace, budget: Budget, keep_recent: int = 10):
        super().__init__(trace, budget)
        self.keep_recent = keep_recent
        self.name = f"masking M={keep_recent}"
        self.start = 0
        self.settings.update(keep_recent=keep_recent)

    def step(self, append: Sequence[Msg]) -> Step:
        self.history.extend(append)
        results = [i for i, m in enumerate(self.history) if m.source in self.tool_outputs]
        masked = set(results[: max(0, len(results) - self.keep_recent)])
        shown = [self.placeholder(m, MASK) if i in masked else m for i, m in enumerate(self.history)]
        body = self.fit(self.system, shown[self.start :])
        dropped = len(shown) - len(body) - self.start
        self.start += dropped
        return Step((*self.system, *body), "truncated" if dropped else "none")


class ContextEditing(_Base):
    name = "clear-tool-uses"

    def __init__(
        self,
        trace: Trace,
        budget: Budget,
        keep: int = 3,
        clear_at_least: int = CLEAR_AT_LEAST_TOKENS,
        clear_tool_inputs: bool = True,
    ):
        super().__init__(trace, budget)
        self.keep = keep
        self.clear_at_least = clear_at_least
        self.clear_tool_inputs = clear_tool_inputs
        self.cleared: set[int] = set()  # trace indexes of cleared results
        self.cleared_calls: set[str] = set()  # their tool call ids
        self.start = 0
        self.settings.update(
            ratio=budget.ratio, keep=keep, clear_at_least=self.clear_at_least, clear_tool_inputs=clear_tool_inputs
        )

    def _shown(self, message: Msg) -> Msg:
        if message.source in self.cleared:
            return self.placeholder(message, CLEARED)
        if self.clear_tool_inputs and any(c.id in self.cleared_calls for c in message.tool_calls):
            calls = tuple(
                ToolCall(c.id, c.name, CLEARED_INPUT) if c.id in self.cleared_calls else c for c in message.tool_calls
            )
            return Msg(message.role, message.content, calls, reasoning=message.reasoning, source=message.source)
        return message

    def _freed(self, results: Sequence[Msg]) -> int:
        """Tokens that clearing `results` (and, with clear_tool_inputs, their calls' arguments) frees."""
        ids = {m.tool_call_id for m in results}
        freed = sum(message_estimate(m) - message_estimate(self.placeholder(m, CLEARED)) for m in results)
        if self.clear_tool_inputs:
            freed += sum(
                estimator.count_text(c.arguments) - estimator.count_text(CLEARED_INPUT)
                for m in self.history
                for c in m.tool_calls
                if c.id in ids
            )
        return freed

    def step(self, append: Sequence[Msg]) -> Step:
        self.history.extend(append)
        cleared = False
        if self.estimate([*self.system, *map(self._shown, self.history[self.start :])]) >= self.budget.trigger:
            results = [m for m in self.history[self.start :] if m.source in self.tool_outputs]
            candidates = [m for m in results[: max(0, len(results) - self.keep)] if m.source not in self.cleared]
            if candidates and self._freed(candidates) >= self.clear_at_least:
                self.cleared.update(m.source for m in candidates)
                self.cleared_calls.update(m.tool_call_id for m in candidates if m.tool_call_id)
                cleared = True
        shown = [self._shown(m) for m in self.history]
        body = self.fit(self.system, shown[self.start :])
        dropped = len(shown) - len(body) - self.start
        self.start += dropped
        action = "truncated" if dropped else "pruned" if cleared else "none"
        return Step((*self.system, *body), action, prunes=int(cleared))


def record(trace: Trace, policy: Policy) -> Recording:
    """Runs `policy` over every model call of `trace`."""
    calls, _ = turns(trace)
    out = []
    for turn in calls:
        step = policy.step(turn.append)
        # A view above the window is what the provider refuses: a failed call, not a billed one.
        refused = "the view is above the window: the provider refuses it" if policy.over_limit(step.view) else ""
        out.append(
            ModelCall(
                step.view, turn.answer, step.action, AGENT_KEY, step.summary_calls, prunes=step.prunes, refused=refused
            )
        )
    return Recording(policy.name, dict(policy.settings), tuple(out), calls[-1].answer.source if calls else 0)
