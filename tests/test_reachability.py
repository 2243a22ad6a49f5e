"""A property over random fold sequences on long recorded sessions, on the pure engine: whatever the
window and whenever the agent prepares, compacts (keeping any amount) or just appends, every tool
result the view does not show in full — folded, pruned or bounded to fit — is reachable through
the references the view names: its own `result_ref` in the view, or listed in a document a
reference in the view names (following documents that name documents)."""

from __future__ import annotations

import functools
import itertools
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxfold.engine import artifacts, estimator, folded_index
from ctxfold.engine.authorship import TEXT, is_text_action
from ctxfold.engine.briefing import record_fold
from ctxfold.engine.candidate import Accepted, accept
from ctxfold.engine.maintenance import (
    Answer,
    Blocked,
    Fold,
    MaintainRequest,
    Prune,
    Snapshot,
    Trigger,
    decide,
    plan_pass,
)
from ctxfold.engine.model import Role, SessionConfig, StoredMessage, ToolCall
from ctxfold.engine.projection import Projection
from ctxfold.engine.prune import bound_to_fit
from ctxfold.engine.tool_results import RESULT_REF
from traces import TRACES_DIR

LONG_SESSIONS = ("claude-code-cctrace-phase0.json", "mini-swe-agent-django-11910.json", "swe-agent-pydicom-1458.json")
BODY = "## Pending & next step\n- continue from the messages below"
SUMMARIZER_WINDOW = 1_000_000


def ref(number: int) -> str:
    """A result_ref of the store's shape ("tr_" and 16 base-32 letters)."""
    return "tr_" + f"{number:016d}".translate(str.maketrans("0123456789", "abcdefghij"))


@functools.cache
def session(name: str) -> tuple[str, tuple[tuple[StoredMessage, ...], ...]]:
    """(system prompt, the batches an agent appends before each model call), as stored: token counts
    counted once, every tool and user message with a result_ref."""
    data = json.loads((TRACES_DIR / name).read_text())
    raw = data["messages"]
    system = raw[0]["content"] if raw and raw[0]["role"] == "system" else ""
    messages = []
    for seq, m in enumerate(raw[1:] if system else raw, 1):
        role = Role(m["role"])
        calls = tuple(
            ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []
        )
        content = m.get("content") or ""
        messages.append(
            StoredMessage(
                id=f"{name}-{seq}",
                seq=seq,
                role=role,
                content=content,
                tokens=estimator.message_tokens(content, calls, m.get("reasoning_content") or ""),
                tool_calls=calls,
                tool_call_id=m.get("tool_call_id") or "",
                result_ref=ref(seq) if role in (Role.TOOL, Role.USER) else "",
            )
        )
    batches: list[list[StoredMessage]] = [[]]
    for message in messages:
        if message.role is Role.ASSISTANT and batches[-1]:
            batches.append([])
        batches[-1].append(message)
    return system, tuple(tuple(b) for b in batches)


class Agent:
    """The maintenance loop of the service, on the pure engine: decide, prune, fold in passes (each
    pass recording its notes and writing its folded-results index document), bound as the last resort."""

    def __init__(self, config: SessionConfig, system: str):
        self.projection = Projection(
            config=config,
            system_tokens=estimator.count_text(system),
            tools_tokens=0,
            calibration=1.0,
            checkpoint=None,
            kept=(),
            after=(),
            pruned={},
        )
        self.index = folded_index.FoldedIndex()
        self.documents: dict[str, str] = {}
        self.refs = (ref(n) for n in itertools.count(10**15))

    def append(self, batch: tuple[StoredMessage, ...]) -> None:
        self.projection = self.projection.extended(batch)

    def maintain(self, request: MaintainRequest) -> None:
        loaded = self.projection.tokens()
        while True:
            match decide(Snapshot(self.projection, loaded, 0), request):
                case Prune() as prune:
                    self.projection = prune.candidate
                case Fold():
                    self.fold(request)
                    break
                case Answer() | Blocked():
                    break
        bound = None if request.trigger is Trigger.COMPACT else bound_to_fit(self.projection)
        if bound is not None:
            self.projection = bound.candidate

    def fold(self, request: MaintainRequest) -> None:
        while (fold := plan_pass(self.projection, SUMMARIZER_WINDOW, request.keep_tokens).first) is not None:
            projection = self.projection
            checkpoint = projection.checkpoint
            folded = [v.source for v in fold.folded if v.source is not None]
            record = record_fold(
                checkpoint.notes if checkpoint is not None else None,
                self.index,
                projection.messages,
                folded,
                next(self.refs),
                artifacts.budget(projection.config),
                projection.anchor_end,
                projection.mode,
            )
            outcome = accept(projection, fold, record.notes, BODY, next(self.refs))
            if not isinstance(outcome, Accepted):
                return
            self.projection, self.index = outcome.candidate, record.index
            self.documents[record.notes.index_ref] = folded_index.render(record.index)
            if fold.final or request.one_pass:
                return

    def reachable(self) -> set[str]:
        """Every result_ref the view names, directly or through the documents it names, recursively."""
        view = self.projection.view()
        text = "\n".join(
            [v.content for v in view] + [c.arguments for v in view if v.source for c in v.source.tool_calls]
        )
        found: set[str] = set()
        pending = set(RESULT_REF.findall(text))
        while pending:
            ref = pending.pop()
            found.add(ref)
            pending |= set(RESULT_REF.findall(self.documents.get(ref, ""))) - found
        return found


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    name=st.sampled_from(LONG_SESSIONS),
    window=st.sampled_from([8000, 12000, 16000, 32000]),
    actions=st.data(),
)
def test_every_hidden_result_is_reachable_from_the_view_after_any_fold_sequence(
    name: str, window: int, actions: st.DataObject
) -> None:
    system, batches = session(name)
    agent = Agent(SessionConfig(context_window=window, system_prompt=system), system)
    appended: list[StoredMessage] = []
    for batch in batches:
        agent.append(batch)
        appended += batch
        action = actions.draw(st.sampled_from(["append", "prepare", "prepare", "prepare", "overflow", "compact"]))
        if action == "prepare":
            agent.maintain(MaintainRequest())
        elif action == "overflow":
            agent.maintain(MaintainRequest(Trigger.OVERFLOW))
        elif action == "compact":
            keep = actions.draw(st.sampled_from([0, 500, 4000]))
            agent.maintain(MaintainRequest(Trigger.COMPACT, keep_tokens=keep))
        projection = agent.projection
        shown = {v.source.id for v in projection.view() if v.source is not None and not v.pruned}
        outputs = [
            m
            for i, m in enumerate(appended)
            if m.role is Role.TOOL or (projection.mode == TEXT and i and is_text_action(appended[i - 1], TEXT))
        ]
        hidden = [m for m in outputs if m.id not in shown]
        reachable = agent.reachable()
        lost = [m.seq for m in hidden if m.result_ref not in reachable]
        assert not lost, f"{name} at window {window}: results {lost} are reachable from no reference of the view"
