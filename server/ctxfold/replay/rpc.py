"""The replay's calls to a ctxfold server, one function each, over the generated gRPC stub: Prepare
(with its progress), ObserveUsage, the trailing append, and reading back stored references and the
documents a view names; with the conversion of trace messages to and from the wire. A failed call
raises `ReplayError` (`PrepareRefused` when the service could not give a view that fits)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ctxfold.engine.model import ToolCall
from ctxfold.replay import probes
from ctxfold.replay.options import ReplayError
from ctxfold.replay.simulator import Bill
from ctxfold.replay.trace import Msg, Trace, Turn
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

_TO_PB = {"system": pb.ROLE_SYSTEM, "user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT, "tool": pb.ROLE_TOOL}
_FROM_PB = {v: k for k, v in _TO_PB.items()}


def to_pb(message: Msg) -> pb.Message:
    return pb.Message(
        role=_TO_PB[message.role],
        content=message.content,
        tool_call_id=message.tool_call_id,
        reasoning_content=message.reasoning,
        tool_calls=[pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in message.tool_calls],
    )


def from_pb(message: pb.Message, sources: dict[int, int]) -> Msg:
    """A view message as a `Msg`; `sources` maps canonical seqs to trace indexes."""
    return Msg(
        role=_FROM_PB.get(message.role, "user"),
        content=message.content,
        tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in message.tool_calls),
        tool_call_id=message.tool_call_id,
        reasoning=message.reasoning_content,
        source=sources.get(message.seq, -1) if message.id else -1,
        summary=message.summary,
        elided=message.pruned,
        ref=message.result_ref,
    )


class PrepareRefused(Exception):
    """The service could not give a view that fits (a failed precondition such as
    CONTEXT_BUDGET_UNSATISFIED): the agent is stuck at this turn."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


async def prepare(
    stub: pb_grpc.ContextServiceAsyncStub,
    session_id: str,
    append: Sequence[Msg],
    metadata: tuple[tuple[str, str], ...],
    number: int,
) -> tuple[pb.PreparedContext, list[pb.FoldProgress]]:
    progress: list[pb.FoldProgress] = []
    result: pb.PreparedContext | None = None
    try:
        stream = stub.Prepare(
            pb.PrepareRequest(session_id=session_id, append=[to_pb(m) for m in append]), metadata=metadata
        )
        async for event in stream:
            if event.HasField("progress"):
                progress.append(event.progress)
            else:
                result = event.result
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED):
            raise PrepareRefused(f"{exc.code().name}: {exc.details()}") from None
        raise ReplayError(f"turn {number}: Prepare failed: {exc.code().name}: {exc.details()}") from None
    if result is None:
        raise ReplayError(f"turn {number}: Prepare ended without a result")
    return result, progress


async def observe(
    stub: pb_grpc.ContextServiceAsyncStub,
    session_id: str,
    view_version: int,
    bill: Bill,
    turn: Turn,
    metadata: tuple[tuple[str, str], ...],
    number: int,
) -> None:
    """ObserveUsage with what the simulated provider billed for the view."""
    try:
        await stub.ObserveUsage(
            pb.ObserveUsageRequest(
                session_id=session_id,
                view_version=view_version,
                input_tokens=bill.cache.input_tokens,
                cached_input_tokens=bill.cache.hit,
                output_tokens=bill.output_tokens,
                finish_reason="tool_calls" if turn.answer.tool_calls else "stop",
            ),
            metadata=metadata,
        )
    except grpc.aio.AioRpcError as exc:
        raise ReplayError(f"turn {number}: ObserveUsage failed: {exc.code().name}: {exc.details()}") from None


async def append_trailing(
    stub: pb_grpc.ContextServiceAsyncStub,
    session_id: str,
    trailing: Sequence[Msg],
    metadata: tuple[tuple[str, str], ...],
) -> None:
    """The messages after the last answer: appended, never sent (they have no recorded answer)."""
    if not trailing:
        return
    try:
        await stub.AppendMessages(
            pb.AppendMessagesRequest(session_id=session_id, messages=[to_pb(m) for m in trailing]), metadata=metadata
        )
    except grpc.aio.AioRpcError as exc:
        raise ReplayError(f"appending the last messages failed: {exc.code().name}: {exc.details()}") from None


async def stored_refs(
    stub: pb_grpc.ContextServiceAsyncStub,
    session_id: str,
    sources: dict[int, int],
    metadata: tuple[tuple[str, str], ...],
) -> dict[int, str]:
    """The result_ref of every stored message that has one, by trace index (read back, so that the
    messages a refused Prepare appended are known too)."""
    refs: dict[int, str] = {}
    token = ""
    while True:
        try:
            page = await stub.ListMessages(
                pb.ListMessagesRequest(session_id=session_id, page_size=1000, page_token=token), metadata=metadata
            )
        except grpc.aio.AioRpcError as exc:
            raise ReplayError(f"ListMessages failed: {exc.code().name}: {exc.details()}") from None
        for message in page.messages:
            if message.result_ref and message.seq in sources:
                refs[sources[message.seq]] = message.result_ref
        token = page.next_page_token
        if not token:
            return refs


async def read_documents(
    stub: pb_grpc.ContextServiceAsyncStub,
    session_id: str,
    view: Sequence[Msg],
    trace: Trace,
    refs: dict[int, str],
    metadata: tuple[tuple[str, str], ...],
) -> dict[str, str]:
    """Every reference the view names that is not a tool result's own (the folded-results index, a
    bounded task or instruction), read in full through ReadToolResult as an agent would: what the
    service really serves is what the probes may count as reachable. A reference the service does
    not serve is left out."""
    results = {ref for source, ref in refs.items() if trace.messages[source].role == "tool"}
    documents: dict[str, str] = {}
    for ref in probes.refs_named(probes.view_text(view)):
        if ref in results:
            continue
        pages: list[str] = []
        offset, complete = 0, False
        try:
            while not complete:
                page = await stub.ReadToolResult(
                    pb.ReadToolResultRequest(session_id=session_id, result_ref=ref, offset=offset), metadata=metadata
                )
                pages.append(page.data)
                offset, complete = page.next_offset, page.complete or page.next_offset <= offset
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                continue
            raise ReplayError(f"ReadToolResult({ref}) failed: {exc.code().name}: {exc.details()}") from None
        documents[ref] = "".join(pages)
    return documents
