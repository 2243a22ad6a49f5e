"""Streams with the read tool: when the model calls ctxfold's `read_tool_result` in a streamed turn,
the gateway answers it and asks again, and the agent must see one ordinary stream. A splicer decides,
event by event, what of each round reaches the agent: the read call's own events are dropped (and
the indexes after it renumbered, so the agent sees no gap), a continued turn's end events are held
back, a later round's opening events are dropped and its indexes continue the earlier rounds'. It
also rebuilds each round's turn in the non-streamed shape, to continue the conversation from.

Events a splicer leaves alone keep their bytes: a stream without a read call is unchanged."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import orjson

from ctxfold.gateway.formats import as_dict, as_list, text_of


@dataclass(frozen=True)
class Step:
    forward: bool
    data: dict[str, Any] | None = None  # the event rewritten; None keeps its bytes


KEEP = Step(True)
DROP = Step(False)


def stream_index(value: Any) -> int | None:
    """An event's block, call or item index; None when it is not a number (an odd upstream's: the event
    is passed on as it came, and an int() of it failed the stream)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def tool_input(partial_json: str) -> Any:
    """A streamed tool call's input from its JSON deltas ({} when they are not JSON: the read call is then
    answered as a bad call, and the provider still gets an object)."""
    try:
        return orjson.loads(partial_json or "{}")
    except orjson.JSONDecodeError:
        return {}


def event_bytes(data: dict[str, Any], named: bool) -> bytes:
    head = f"event: {data.get('type')}\n".encode() if named else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


@dataclass
class Splicer(abc.ABC):
    read_name: str
    rounds: int = 0  # rounds finished before this one
    can_continue: bool = True  # another round may follow this one
    reads: list[str] = field(default_factory=list)  # call ids of this round's read calls

    named_events = True  # SSE `event:` lines

    def next_round(self, can_continue: bool) -> None:
        self.rounds += 1
        self.can_continue = can_continue
        self.reads = []
        self._start_round()

    @property
    def holds_end(self) -> bool:
        """This round's turn is continued: its end stays with the gateway."""
        return bool(self.reads) and self.can_continue

    @abc.abstractmethod
    def _start_round(self) -> None: ...

    @abc.abstractmethod
    def step(self, data: dict[str, Any] | None) -> Step:
        """What to do with one event (its JSON data; None for `[DONE]` and other non-JSON data)."""

    @abc.abstractmethod
    def turn(self) -> dict[str, Any]:
        """This round's answer in the non-streamed shape."""


@dataclass
class AnthropicSplicer(Splicer):
    """Blocks are numbered by `index`; the message opens with message_start and ends with
    message_delta and message_stop."""

    _next_index: int = 0
    _indexes: dict[int, int] = field(default_factory=dict)  # upstream index -> the agent's, this round
    _dropped: set[int] = field(default_factory=set)
    _message: dict[str, Any] = field(default_factory=dict)
    _blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    _partial_json: dict[int, str] = field(default_factory=dict)

    def _start_round(self) -> None:
        self._indexes, self._dropped, self._blocks, self._partial_json = {}, set(), {}, {}

    def step(self, data: dict[str, Any] | None) -> Step:
        if data is None:
            return KEEP
        kind = data.get("type")
        if kind == "message_start":
            self._message = as_dict(data.get("message"))
            return KEEP if self.rounds == 0 else DROP
        if kind in ("message_delta", "message_stop"):
            return DROP if self.holds_end else KEEP
        if kind not in ("content_block_start", "content_block_delta", "content_block_stop"):
            return KEEP
        index = stream_index(data.get("index", 0))
        if index is None:
            return KEEP
        self._accumulate(kind, index, data)
        if kind == "content_block_start":
            block = as_dict(data.get("content_block"))
            if block.get("type") == "tool_use" and block.get("name") == self.read_name:
                self._dropped.add(index)
                self.reads.append(text_of(block.get("id")))
                return DROP
            self._indexes[index] = self._next_index
            self._next_index += 1
        if index in self._dropped:
            return DROP
        agent_index = self._indexes.get(index, index)
        return KEEP if agent_index == index else Step(True, {**data, "index": agent_index})

    def _accumulate(self, kind: str, index: int, data: dict[str, Any]) -> None:
        if kind == "content_block_start":
            self._blocks[index] = dict(as_dict(data.get("content_block")))
            return
        block = self._blocks.setdefault(index, {})
        if kind == "content_block_stop":
            if index in self._partial_json:
                block["input"] = tool_input(self._partial_json.pop(index))
            return
        delta = as_dict(data.get("delta"))
        field_of = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}
        name = field_of.get(text_of(delta.get("type")))
        if name is not None:
            block[name] = text_of(block.get(name)) + text_of(delta.get(name))
        elif delta.get("type") == "input_json_delta":
            self._partial_json[index] = self._partial_json.get(index, "") + text_of(delta.get("partial_json"))

    def turn(self) -> dict[str, Any]:
        return {**self._message, "content": [self._blocks[i] for i in sorted(self._blocks)]}


@dataclass
class ChatSplicer(Splicer):
    """Chunks carry `choices[0].delta` with content and `tool_calls` numbered by `index`; the turn
    ends with a chunk holding `finish_reason`, a usage chunk and `data: [DONE]`."""

    named_events = False
    _next_index: int = 0
    _indexes: dict[int, int] = field(default_factory=dict)
    _dropped: set[int] = field(default_factory=set)
    _content: str = ""
    _calls: dict[int, dict[str, Any]] = field(default_factory=dict)

    def _start_round(self) -> None:
        self._indexes, self._dropped, self._content, self._calls = {}, set(), "", {}

    def step(self, data: dict[str, Any] | None) -> Step:
        if data is None:  # [DONE]
            return DROP if self.holds_end else KEEP
        choices = as_list(data.get("choices"))
        if not choices:  # the usage chunk
            return DROP if self.holds_end else KEEP
        choice = as_dict(choices[0])
        delta = as_dict(choice.get("delta"))
        self._content += text_of(delta.get("content"))
        calls, changed = [], False
        for call in map(as_dict, as_list(delta.get("tool_calls"))):
            index = stream_index(call.get("index", 0))
            if index is None:
                calls.append(call)
                continue
            function = as_dict(call.get("function"))
            entry = self._calls.setdefault(
                index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            entry["id"] = text_of(call.get("id")) or entry["id"]
            entry["function"]["name"] += text_of(function.get("name"))
            entry["function"]["arguments"] += text_of(function.get("arguments"))
            if index not in self._indexes and index not in self._dropped:
                if entry["function"]["name"] == self.read_name:
                    self._dropped.add(index)
                    self.reads.append(entry["id"])
                else:
                    self._indexes[index] = self._next_index
                    self._next_index += 1
            if index in self._dropped:
                changed = True
                continue
            agent_index = self._indexes.get(index, index)
            changed = changed or agent_index != index
            calls.append({**call, "index": agent_index})
        finishing = choice.get("finish_reason") is not None
        if finishing and self.holds_end:
            return DROP
        if not changed:
            return KEEP
        if not calls and not delta.get("content") and not finishing and not delta.get("role"):
            return DROP
        new_delta = {**delta, "tool_calls": calls} if calls else {k: v for k, v in delta.items() if k != "tool_calls"}
        return Step(True, {**data, "choices": [{**choice, "delta": new_delta}, *choices[1:]]})

    def turn(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self._content or None}
        if self._calls:
            message["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        return {"choices": [{"index": 0, "message": message}]}


@dataclass
class ResponsesSplicer(Splicer):
    """Events carry `sequence_number` and, for items, `output_index`; the stream opens with
    response.created / response.in_progress and ends with response.completed (holding the whole
    response, whose `output` the agent's SDK takes as final: it gets the earlier rounds' items too)."""

    _next_index: int = 0
    _next_sequence: int = 0
    _indexes: dict[int, int] = field(default_factory=dict)
    _dropped: set[int] = field(default_factory=set)
    _forwarded_items: list[dict[str, Any]] = field(default_factory=list)  # of the rounds before this one
    _items: dict[int, dict[str, Any]] = field(default_factory=dict)  # this round's, done
    _response: dict[str, Any] = field(default_factory=dict)
    _response_id: str = ""  # the first round's: the agent's SDK checks it stays the same

    def _start_round(self) -> None:
        self._forwarded_items += [self._items[i] for i in sorted(self._items) if i not in self._dropped]
        self._indexes, self._dropped, self._items, self._response = {}, set(), {}, {}

    def step(self, data: dict[str, Any] | None) -> Step:
        if data is None:
            return KEEP
        kind = text_of(data.get("type"))
        if kind in ("response.created", "response.in_progress", "response.queued"):
            if self.rounds > 0:
                return DROP
            self._response_id = text_of(as_dict(data.get("response")).get("id"))
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self._response = as_dict(data.get("response"))
            if self.holds_end:
                return DROP
            if self.rounds > 0:
                kept = [item for i, item in enumerate(as_list(self._response.get("output"))) if i not in self._dropped]
                output = [*self._forwarded_items, *kept]
                response = {**self._response, "id": self._response_id or self._response.get("id"), "output": output}
                return self._numbered({**data, "response": response}, force=True)
            return self._numbered(data)
        index = stream_index(data.get("output_index"))
        if index is None:
            return self._numbered(data)
        item = as_dict(data.get("item"))
        if kind == "response.output_item.added" and index not in self._indexes:
            if item.get("type") == "function_call" and item.get("name") == self.read_name:
                self._dropped.add(index)
                self.reads.append(text_of(item.get("call_id")))
            else:
                self._indexes[index] = self._next_index
                self._next_index += 1
        if kind == "response.output_item.done":
            self._items[index] = item
        if index in self._dropped:
            return DROP
        agent_index = self._indexes.get(index, index)
        return self._numbered({**data, "output_index": agent_index}, force=agent_index != index)

    def _numbered(self, data: dict[str, Any], force: bool = False) -> Step:
        """The event with the agent's next sequence number (unchanged bytes when it already has it)."""
        sequence = self._next_sequence
        self._next_sequence += 1
        if not force and data.get("sequence_number", sequence) == sequence:
            return KEEP
        return Step(True, {**data, "sequence_number": sequence})

    def turn(self) -> dict[str, Any]:
        return self._response


SPLICERS: dict[str, type[Splicer]] = {
    "anthropic_messages": AnthropicSplicer,
    "openai_chat": ChatSplicer,
    "openai_responses": ResponsesSplicer,
}
