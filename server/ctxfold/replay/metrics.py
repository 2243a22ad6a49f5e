"""What a replay measures, pure: each model call goes through the simulated provider, and the run
ends in one `ReplayResult` of plain numbers (JSON-ready with `dataclasses.asdict`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ctxfold.engine import estimator
from ctxfold.replay import probes
from ctxfold.replay.simulator import Bill, Provider, answer_tokens, render
from ctxfold.replay.trace import Msg, Trace, turns

AGENT_KEY = "agent"

# What the agent waits for a summary it cannot go on without, modeled the same for every policy: the
# time to the first token, then the summary written at a typical speed (real models: 50–150 tokens/s).
SUMMARY_FIRST_TOKEN_SECONDS = 1.0
SUMMARY_TOKENS_PER_SECOND = 100.0


@dataclass(frozen=True)
class SummaryCall:
    """One summarizer request as an LLM would receive it, and the tokens of the summary it wrote.
    `key` is the prompt-cache key it is sent with (a cache-safe fork shares the agent's key);
    `background`: made ahead of the call that uses it, so the agent does not wait for it."""

    key: str
    messages: tuple[Msg, ...]
    output_tokens: int
    background: bool = False

    @property
    def wait_seconds(self) -> float:
        """What the agent waits for this summary (modeled; nothing for one made in the background)."""
        return 0.0 if self.background else SUMMARY_FIRST_TOKEN_SECONDS + self.output_tokens / SUMMARY_TOKENS_PER_SECOND


@dataclass(frozen=True)
class ModelCall:
    """One model call of a replay: the view sent, the recorded answer, what the context policy did
    before it (`action`: none, pruned, folded or truncated) and the summary requests it made.
    `refused` says why the call could not be made (a ctxfold Prepare that failed; a baseline's view
    above the window, which the provider refuses): it is a failure of the policy at that turn, billed
    nothing but its summary requests, and counted."""

    view: tuple[Msg, ...]
    answer: Msg
    action: str = "none"
    key: str = AGENT_KEY
    summary_calls: tuple[SummaryCall, ...] = ()
    prunes: int = 0
    failed_summaries: int = 0
    refused: str = ""
    # Of `summary_calls`, those made in the background and never installed (stale or failed): paid for nothing.
    unused_summaries: int = 0
    prepare_seconds: float = 0.0  # how long the agent waited for the policy before this call


@dataclass(frozen=True)
class Recording:
    """Everything a policy sent during a replay, independent of the provider: it can be billed
    under any cache model and price sheet. `appended` is how many trace messages the agent had
    appended by the last call; `refs` maps trace indexes of stored tool results to result_refs;
    `documents` are the texts, by reference, that the policy served for references named in the
    last view (ctxfold: read back through ReadToolResult)."""

    policy: str
    settings: Mapping[str, object]
    calls: tuple[ModelCall, ...]
    appended: int
    refs: Mapping[int, str] = field(default_factory=dict)
    documents: Mapping[str, str] = field(default_factory=dict)


@dataclass
class ReplayResult:
    trace: str
    policy: str
    settings: dict[str, object]
    prices: str
    provider_cache: str
    turns: int = 0
    folds: int = 0  # model calls whose view was folded / summarized
    prunes: int = 0  # prune (ctxfold) steps
    summarizer_calls: int = 0
    failed_summaries: int = 0
    unused_summaries: int = 0  # summaries made in the background and never installed
    # What the agent waited for summaries (modeled: `SummaryCall.wait_seconds`), in all and before one
    # model call at most; and the longest Prepare of this replay as measured (its summarizer's real time).
    summary_wait_seconds: float = 0.0
    summary_wait_max_seconds: float = 0.0
    prepare_max_seconds: float = 0.0
    # Model calls the policy could not make: a refused Prepare, a view above the window's hard limit
    # (the provider refuses it). Billed nothing: the agent is stuck at that turn.
    refused_calls: int = 0
    peak_view_tokens: int = 0  # provider-counted input tokens of the largest request
    mean_view_tokens: float = 0.0
    summary_tokens: int = 0  # the summary in the last view
    summary_output_tokens: int = 0  # every summary written, together
    input_tokens: int = 0  # billed input of the agent's model calls
    cache_hit_tokens: int = 0
    cache_miss_tokens: int = 0  # everything not read from the cache (cache writes included)
    cache_write_tokens: int = 0  # of the misses, tokens billed as cache writes (Anthropic)
    output_tokens: int = 0
    cost: float = 0.0  # the agent's model calls
    summarizer_input_tokens: int = 0
    summarizer_hit_tokens: int = 0
    summarizer_cost: float = 0.0  # summary requests, modeled as LLM calls under the same prices
    total_cost: float = 0.0
    cache_hit_ratio: float = 0.0
    ideal_cache_hit_ratio: float = 0.0
    # Probes of the last view (ctxfold.replay.probes), computed from the trace and the view text.
    task_kept: int = 0  # 1: the opening user message is there (or its head and a readable reference)
    instructions: int = 0  # messages a person typed after the first
    instructions_kept: int = 0
    paths: int = 0  # paths the agent's actions touched
    paths_named: int = 0
    dropped_tool_results: int = 0  # tool results no longer shown in full in the last view
    recoverable_tool_results: int = 0  # of those, reachable by a result_ref the view or one document it names holds
    recoverable_fraction: float | None = None
    machine_quoted: int = 0  # machine-written user messages a summary of the last view carries as the person's
    series_view_tokens: list[int] = field(default_factory=list)
    series_actions: list[str] = field(default_factory=list)
    series_cumulative_cost: list[float] = field(default_factory=list)
    series_cache_hit_tokens: list[int] = field(default_factory=list)  # per call, of series_view_tokens


def ideal_hit_ratio(trace: Trace) -> float:
    """The physical limit of prompt caching for this conversation: the full history is sent every
    time and every token that was already in the previous request is a hit, so only what is new
    to the conversation (the last answer and the messages appended after it) is a miss."""
    history = [Msg("system", trace.system_prompt)] if trace.system_prompt else []
    total = hits = previous = 0
    for turn in turns(trace)[0]:
        history.extend(turn.append)
        size = len(render(trace.tools_json, history))
        total += size
        hits += previous
        previous = size
    return hits / total if total else 0.0


class Meter:
    """Sends each model call (and its summarizer calls) to the simulated provider and keeps count."""

    def __init__(
        self,
        trace: Trace,
        provider: Provider,
        policy: str,
        settings: Mapping[str, object],
        think_seconds: float = 10.0,
        ideal: float | None = None,
    ):
        self.trace = trace
        self.provider = provider
        self.think_seconds = think_seconds
        self.result = ReplayResult(
            trace=trace.name,
            policy=policy,
            settings=dict(settings),
            prices=provider.prices.name,
            provider_cache=provider.cache.provider,
            ideal_cache_hit_ratio=ideal_hit_ratio(trace) if ideal is None else ideal,
        )
        self._view_token_sum = 0

    def summarizer(self, call: SummaryCall) -> Bill:
        bill = self.provider.send(call.key, self.trace.tools_json, call.messages, call.output_tokens)
        r = self.result
        r.summarizer_calls += 1
        r.summarizer_input_tokens += bill.cache.input_tokens
        r.summarizer_hit_tokens += bill.cache.hit
        r.summarizer_cost += bill.cost
        r.summary_output_tokens += call.output_tokens
        return bill

    def unused(self, call: SummaryCall) -> None:
        """A summary made in the background and never installed, found after the last model call."""
        self.summarizer(call)
        self.result.unused_summaries += 1

    def call(self, call: ModelCall) -> Bill | None:
        """One model call: the summaries made for it first, then the view itself (None when the call
        was refused); then the clock moves on by the think time."""
        for summary_call in call.summary_calls:
            self.summarizer(summary_call)
        r = self.result
        waited = sum(summary_call.wait_seconds for summary_call in call.summary_calls)
        r.summary_wait_seconds += waited
        r.summary_wait_max_seconds = max(r.summary_wait_max_seconds, waited)
        r.turns += 1
        r.folds += int(call.action == "folded")
        r.prunes += call.prunes
        r.failed_summaries += call.failed_summaries
        r.unused_summaries += call.unused_summaries
        r.prepare_max_seconds = max(r.prepare_max_seconds, call.prepare_seconds)
        if call.refused:
            r.refused_calls += 1
            r.series_view_tokens.append(0)
            r.series_actions.append("refused")
            r.series_cumulative_cost.append(r.cost + r.summarizer_cost)
            r.series_cache_hit_tokens.append(0)
            self.provider.advance(self.think_seconds)
            return None
        bill = self.provider.send(call.key, self.trace.tools_json, call.view, answer_tokens(call.answer))
        r.input_tokens += bill.cache.input_tokens
        r.cache_hit_tokens += bill.cache.hit
        r.cache_miss_tokens += bill.cache.uncached
        r.cache_write_tokens += bill.cache.write
        r.output_tokens += bill.output_tokens
        r.cost += bill.cost
        r.peak_view_tokens = max(r.peak_view_tokens, bill.cache.input_tokens)
        self._view_token_sum += bill.cache.input_tokens
        r.series_view_tokens.append(bill.cache.input_tokens)
        r.series_actions.append(call.action)
        r.series_cumulative_cost.append(r.cost + r.summarizer_cost)
        r.series_cache_hit_tokens.append(bill.cache.hit)
        r.summary_tokens = sum(estimator.count_text(m.content) for m in call.view if m.summary)
        self.provider.advance(self.think_seconds)
        return bill

    def finish(
        self,
        final_view: Sequence[Msg],
        appended: int,
        refs: Mapping[int, str] | None = None,
        documents: Mapping[str, str] | None = None,
    ) -> ReplayResult:
        """The totals and the probes; `final_view` is the last view sent, `appended` how many trace
        messages the agent had appended by then, `refs` the result_ref of each stored tool result,
        `documents` what the policy serves by reference (see `Recording`)."""
        r = self.result
        r.mean_view_tokens = self._view_token_sum / r.turns if r.turns else 0.0
        r.total_cost = r.cost + r.summarizer_cost
        r.cache_hit_ratio = r.cache_hit_tokens / r.input_tokens if r.input_tokens else 0.0
        scores = probes.score(self.trace, final_view, appended, refs, documents)
        r.task_kept = scores.task_kept
        r.instructions, r.instructions_kept = scores.instructions, scores.instructions_kept
        r.paths, r.paths_named = scores.paths, scores.paths_named
        r.dropped_tool_results, r.recoverable_tool_results = scores.hidden_tool_results, scores.reachable_tool_results
        r.recoverable_fraction = r.recoverable_tool_results / r.dropped_tool_results if r.dropped_tool_results else None
        r.machine_quoted = scores.machine_quoted
        return r


def bill(
    trace: Trace, recording: Recording, provider: Provider, think_seconds: float = 10.0, ideal: float | None = None
) -> ReplayResult:
    """Bills a recording under `provider`'s cache model and prices."""
    meter = Meter(trace, provider, recording.policy, recording.settings, think_seconds, ideal)
    for call in recording.calls:
        meter.call(call)
    return meter.finish(last_view(recording.calls), recording.appended, recording.refs, recording.documents)


def last_view(calls: Sequence[ModelCall]) -> tuple[Msg, ...]:
    """The last view a policy sent (the probes score it): a refused call sent none."""
    return next((c.view for c in reversed(calls) if not c.refused), ())
