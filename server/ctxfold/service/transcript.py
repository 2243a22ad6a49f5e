"""The canonical transcript: the one append (all or nothing, idempotent with a request id, with the
answer's bookkeeping when it makes one) and pages of messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ctxfold import cpu
from ctxfold.engine.answer import PreparedContext
from ctxfold.engine.context import AppendRequest, Context, SessionRecord, append, append_work
from ctxfold.engine.errors import DomainError, invalid, kept_changing
from ctxfold.engine.model import NewMessage, StoredMessage, text_chars
from ctxfold.engine.transcript import AppendLimits
from ctxfold.service.contexts import Contexts
from ctxfold.service.paging import decode_token, encode_token, page_size
from ctxfold.store import Store
from ctxfold.store.append import AppendWrite, Bookkeeping, Repeated, Stale
from ctxfold.store.append import Written as WrittenRows
from ctxfold.store.rows import EncodedResult, append_rows

MAX_REQUEST_ID_CHARS = 128


# An append that keeps losing compare-and-swap races (or whose cached context keeps being behind) gives
# up after this many attempts.
MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class Written:
    """An append as written: its messages (the first append's, for a request id seen before), the
    context after it (None after a repeated request id: the store has it), and the answer written with
    it when no maintenance was due."""

    messages: list[StoredMessage]
    context: Context | None
    answered: PreparedContext | None


class Transcript:
    def __init__(self, store: Store, contexts: Contexts, limits: AppendLimits, max_response_bytes: int):
        self.store = store
        self.contexts = contexts
        self.limits = limits
        # A ListMessages page holds at most this many characters (4 UTF-8 bytes each, and room for the framing),
        # so it fits one response whatever page_size asks; a shorter page comes with a next_page_token.
        self.max_page_chars = max_response_bytes // 8

    async def append_messages(
        self, tenant: str, session_id: str, messages: Sequence[NewMessage], request_id: str
    ) -> tuple[list[StoredMessage], SessionRecord]:
        """AppendMessages: the append alone (no answer); returns the messages as stored and the session
        after them."""
        written = await self.append(tenant, session_id, messages, request_id, AppendRequest((), 0.0, answer=False))
        session = written.context.session if written.context else await self.store.get_session(tenant, session_id)
        return written.messages, session

    async def append(
        self, tenant: str, session_id: str, messages: Sequence[NewMessage], request_id: str, request: AppendRequest
    ) -> Written:
        """Appends `messages` (all of them or none) to the session as it is, with the answer's bookkeeping
        when `request` asks for one and no maintenance is due: the one write of AppendMessages and
        Prepare. A request id seen before appends nothing and answers the first append's messages."""
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            raise invalid("INVALID_REQUEST_ID", f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters")
        async with self.contexts.turns.hold(session_id):
            context = await self.contexts.load(tenant, session_id)
            work = text_chars(messages) + len(messages) * cpu.MESSAGE_WORK_BYTES
            rows, results = await cpu.run(work, append_rows, messages, context.config, self.limits, request.field)
            request = replace(request, messages=tuple(r.message for r in rows))
            return await self._write(context, request_id, request, results)

    async def _write(
        self, context: Context, request_id: str, request: AppendRequest, raw_results: tuple[EncodedResult, ...]
    ) -> Written:
        """The append's write, decided on `context` and, when that turns out behind the store, on the store's."""
        for attempt in range(MAX_ATTEMPTS):
            if attempt:  # the cached context was behind what the store has: decide on that
                context = await self.contexts.load(context.session.tenant, context.session.id, fresh=True)
            appending = replace(request, now=self.store.clock())
            work = append_work(context, appending) * cpu.MESSAGE_WORK_BYTES
            try:
                step = await cpu.run(work, append, context, appending)
            except DomainError:
                if attempt:
                    raise
                continue
            book = step.bookkeeping()
            bookkeeping = Bookkeeping(book[0], context.revision, book[1]) if book else None
            write = AppendWrite(
                context.session, step.context.session, step.messages, raw_results, request_id, bookkeeping
            )
            match await self.store.append(write):
                case Stale():
                    self.contexts.written(context.session, None)
                case Repeated(message_ids):
                    return Written(await self.store.messages(message_ids), None, None)
                case WrittenRows(revision):
                    grown = step.written(revision)  # None: the bookkeeping was skipped, the append stands
                    self.contexts.written(context.session, grown, grown_by=step.messages)
                    return Written(list(step.messages), grown or step.context, step.answered)
        raise kept_changing(context.session.id, "during the append", "retry with the same request_id")

    async def list(
        self, tenant: str, session_id: str, requested_size: int, token: str, include_abandoned: bool
    ) -> tuple[list[StoredMessage], str]:
        size = page_size(requested_size)
        scope = f"messages:{session_id}:{int(include_abandoned)}"
        position = decode_token(scope, token, (int, int, str))
        after = (position[0], position[1], position[2]) if position else None
        session = await self.store.get_session(tenant, session_id)
        messages, cursor = await self.store.list_messages(session, size, after, include_abandoned, self.max_page_chars)
        return messages, encode_token(scope, list(cursor)) if cursor else ""
