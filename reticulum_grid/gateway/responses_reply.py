"""OpenAI's Responses API answers for what the grid streams back.

``Turn`` follows one request's stream pieces (Text, ToolCallDelta, then one
Usage, from client/stream.py) and gives both the typed stream events and the
whole Response object, so a streamed answer and a whole one are the same:
a ``message`` output item with one ``output_text`` part for the text, then a
``function_call`` item per tool call. Events, in the order OpenAI sends them
(openai-python's ``types/responses/response_stream_event.py``; its stream
helper, lib/streaming/responses, checks the order)::

    response.created, response.in_progress,
    response.output_item.added, response.content_part.added,
    response.output_text.delta ..., response.output_text.done,
    response.content_part.done, response.output_item.done,       (the text)
    response.output_item.added, response.function_call_arguments.delta ...,
    response.function_call_arguments.done, response.output_item.done,  (each call)
    response.completed | response.incomplete (cut by max_output_tokens)

and on a failure after the first piece ``error``, then ``response.failed``.
Each carries ``sequence_number`` from 0. When the request asked for logprobs,
each text delta carries its tokens' and the ``output_text`` part all of them. The Response object adds ``rngrid``:
where and how fast it ran (openai_reply.grid_usage).
"""

import secrets
import time
from collections.abc import Sequence
from typing import Any

from reticulum_grid.client import ToolCallDelta, Usage
from reticulum_grid.gateway.errors import ApiError
from reticulum_grid.gateway.openai_api import ChatMessage, ToolCall
from reticulum_grid.gateway.openai_reply import grid_usage
from reticulum_grid.gateway.responses_api import Request

#: An output item (a ``message`` or a ``function_call``) or a stream event, as OpenAI's JSON.
Item = dict[str, Any]


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class Turn:
    """One ``/v1/responses`` answer: ``add(piece)`` and ``finish(usage)`` return
    the stream events they make; ``response()`` is the Response object so far.
    ``request``: the responses_api.Request."""

    def __init__(self, request: Request) -> None:
        self.id = _id("resp")
        self.model, self.echo, self.top = request.model, request.echo, request.top_logprobs
        self.created_at = int(time.time())
        self.status = "in_progress"
        self.usage: Usage | None = None
        self.error: dict[str, str] | None = None
        self.completed_at: int | None = None
        self.items: list[Item] = []  # output items in order: message {"content": [...]} or function_call
        self._text: Item | None = None  # the message item being written, when there is one
        self._calls: dict[int, Item] = {}  # the tower's tool-call index -> its function_call item
        self._logprobs: list[dict[str, Any]] = []  # the text's tokens' logprobs as the tower gave them (when asked)
        self._seq = 0

    def start(self) -> list[Item]:
        """response.created and response.in_progress."""
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    def add(self, piece: str | ToolCallDelta) -> list[Item]:
        """The events for one stream piece (text or a ToolCallDelta)."""
        if isinstance(piece, ToolCallDelta):
            return self._call_delta(piece)
        tokens = list(getattr(piece, "logprobs", ())) if self.top is not None else []
        if not piece and not tokens:  # (a token that ends inside a character has a logprob and no text yet)
            return []
        text, events = (self._text, []) if self._text is not None else self._open_message()
        self._logprobs += tokens
        part = text["content"][0]
        part["text"] += piece
        part["logprobs"] += [_token(lp, self.top, ("token", "logprob", "bytes")) for lp in tokens]
        return events + [self._event("response.output_text.delta", item_id=text["id"],
                                     output_index=self._index(text), content_index=0, delta=str(piece),
                                     logprobs=[_token(lp, self.top) for lp in tokens])]

    def finish(self, usage: Usage) -> list[Item]:
        """Close every item and the response for the stream's Usage: its last events."""
        self.usage = usage
        cut = usage.finish_reason == "length"
        events = [] if self.items else self._open_message()[1]  # an empty answer is still one (empty) message
        for item in self.items:
            item["status"] = "incomplete" if cut else "completed"
            events += self._close(item)
        self.status, self.completed_at = ("incomplete" if cut else "completed"), int(time.time())
        return events + [self._event(f"response.{self.status}", response=self.response())]

    def fail(self, error: ApiError) -> list[Item]:
        """``error`` and ``response.failed`` for an errors.ApiError after the first piece."""
        self.status, self.error = "failed", {"code": "server_error", "message": error.message}
        for item in self.items:
            item["status"] = "incomplete"
        return [self._event("error", code=error.code, message=error.message, param=error.param),
                self._event("response.failed", response=self.response())]

    def response(self) -> dict[str, Any]:
        """The Response object (openai-python's types/responses/response.py)."""
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": self.status,
            "error": self.error, "incomplete_details": None, "model": self.model,
            "output": [dict(item) for item in self.items] if self.status != "in_progress" else [],
            "usage": None, **self.echo}
        if self.status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        if self.completed_at is not None:
            out["completed_at"] = self.completed_at
        if self.usage is not None:
            out["usage"] = usage_map(self.usage)
            out["rngrid"] = grid_usage(self.usage)
        return out

    def output_messages(self) -> list[ChatMessage]:
        """The output as chat messages (one assistant message: its text and tool calls), for the next turn."""
        text = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "message")
        message: ChatMessage = {"role": "assistant", "content": text or None}
        calls: list[ToolCall] = [
            {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
            for i in self.items if i["type"] == "function_call"]
        if calls:
            message["tool_calls"] = calls
        return [message]

    # -- items ------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> Item:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _index(self, item: Item) -> int:
        return next(i for i, it in enumerate(self.items) if it is item)

    def _open_message(self) -> tuple[Item, list[Item]]:
        """The text's message item, opened, and its events."""
        text: Item = {"id": _id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                      "content": [_part("")]}
        self._text = text
        self.items.append(text)
        added = dict(text, content=[])
        return text, [self._event("response.output_item.added", output_index=len(self.items) - 1, item=added),
                      self._event("response.content_part.added", item_id=text["id"], output_index=len(self.items) - 1,
                                  content_index=0, part=_part(""))]

    def _call_delta(self, piece: ToolCallDelta) -> list[Item]:
        events: list[Item] = []
        item = self._calls.get(piece.index)
        if item is None:
            item = self._calls[piece.index] = {"id": _id("fc"), "type": "function_call", "status": "in_progress",
                                               "call_id": piece.id or _id("call"), "name": piece.name, "arguments": ""}
            self.items.append(item)
            events.append(self._event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item)))
        item["name"] = item["name"] or piece.name
        if piece.arguments:
            item["arguments"] += piece.arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self._index(item), delta=piece.arguments))
        return events

    def _close(self, item: Item) -> list[Item]:
        where = {"item_id": item["id"], "output_index": self._index(item)}
        if item["type"] == "function_call":
            events = [self._event("response.function_call_arguments.done", **where, arguments=item["arguments"])]
        else:
            part = item["content"][0]
            events = [self._event("response.output_text.done", **where, content_index=0, text=part["text"],
                                  logprobs=[_token(lp, self.top) for lp in self._logprobs]),
                      self._event("response.content_part.done", **where, content_index=0, part=dict(part))]
        return events + [self._event("response.output_item.done", output_index=where["output_index"], item=dict(item))]


def _token(lp: dict[str, Any], top: int | None, keys: Sequence[str] = ("token", "logprob")) -> dict[str, Any]:
    """A token's logprob (a Text's: {token, logprob, bytes, top}) in the Responses API's
    shape: ``keys`` of it and of its first ``top`` alternatives (``top_logprobs``)."""
    return {**{k: lp[k] for k in keys}, "top_logprobs": [{k: alt[k] for k in keys} for alt in lp["top"][:top]]}


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage_map(usage: Usage) -> dict[str, Any]:
    """A Usage as the Responses API's ``usage``: ``cached_tokens`` are prompt tokens
    the runner took from its cache; ``cache_write_tokens`` (OpenAI's billed cache
    writes) is 0, as the runner's prompt cache costs nothing to fill."""
    details = {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0}
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": details,
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}
