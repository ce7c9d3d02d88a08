"""OpenAI's response shapes for what the grid streams back.

``Reply`` builds one request's chat or text completion objects: stream
chunks (text, ``tool_calls`` deltas, ``logprobs``) and the whole response
(``message.tool_calls``, ``finish_reason`` ``tool_calls``). ``embeddings``
builds a ``/v1/embeddings`` answer. The pieces come from the Grid
(client/stream.py): Text (a str whose ``logprobs`` are
[{token, logprob, bytes, top: [...]}]), ToolCallDelta and a final Usage.
"""

import base64
import math
import secrets
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any

from reticulum_grid.client import Embeddings, ToolCallDelta, Usage
from reticulum_grid.gateway.inference import Output
from reticulum_grid.gateway.openai_api import EmbedRequest, ToolCall

#: finish_reason values OpenAI clients know; anything else a tower says reads as "stop".
FINISH_REASONS = ("stop", "length", "tool_calls")


class Reply:
    """OpenAI response objects for one request (chat or text completion);
    ``top_logprobs``: alternatives per token to show (None: no logprobs)."""

    def __init__(self, chat: bool, model: str, top_logprobs: int | None = None) -> None:
        self.chat, self.model, self.top_logprobs = chat, model, top_logprobs
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self._offset = 0  # characters of text so far (the completions API's text_offset)

    def _wrap(self, choices: list[dict[str, Any]], streamed: bool, **extra: Any) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if streamed and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}

    def chunk(self, piece: str | ToolCallDelta = "", finish_reason: str | None = None,
              first: bool = False) -> dict[str, Any]:
        """One stream chunk with ``piece`` (text or a ToolCallDelta; the role on the ``first``)."""
        if isinstance(piece, ToolCallDelta):
            call: dict[str, Any] = {"index": piece.index, "function": {"arguments": piece.arguments}}
            if piece.id:
                call.update(id=piece.id, type="function")
            if piece.name:
                call["function"]["name"] = piece.name
            choice = {"index": 0, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None}
            return self._wrap([choice], True)
        logprobs = self._logprobs(piece)
        if self.chat:
            delta: dict[str, str] = (({"role": "assistant"} if first else {})
                                     | ({"content": piece} if piece or first else {}))
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": piece, "logprobs": logprobs, "finish_reason": finish_reason}
        return self._wrap([choice], True)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
        return self._wrap([], True, usage=usage_map(usage))

    def complete(self, pieces: Sequence[Output], usage: Usage) -> dict[str, Any]:
        """The whole (non-streamed) response from every piece before the Usage."""
        text = "".join(p for p in pieces if isinstance(p, str))
        logprobs = self._logprobs_of(pieces)
        finish = finish_reason(usage)
        if self.chat:
            calls = tool_calls(pieces)
            message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None,
                                       "refusal": None}
            if calls:
                message["tool_calls"] = calls
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return self._wrap([choice], False, usage=usage_map(usage), rngrid=grid_usage(usage))

    # -- logprobs ---------------------------------------------------------
    def _logprobs(self, piece: str) -> dict[str, Any] | None:
        return None if self.top_logprobs is None else self._logprobs_of([piece])

    def _logprobs_of(self, pieces: Iterable[object]) -> dict[str, Any] | None:
        """Chat: {"content": [{token, logprob, bytes, top_logprobs}], "refusal"};
        completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}."""
        if self.top_logprobs is None:
            return None
        items = [lp for p in pieces if isinstance(p, str) for lp in getattr(p, "logprobs", ())]
        if self.chat:
            return {"content": [{"token": lp["token"], "logprob": lp["logprob"], "bytes": lp["bytes"],
                                 "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                                                  for t in lp["top"][:self.top_logprobs]]} for lp in items],
                    "refusal": None}
        offsets = []
        for lp in items:
            offsets.append(self._offset)
            self._offset += len(lp["token"])
        return {"tokens": [lp["token"] for lp in items], "token_logprobs": [lp["logprob"] for lp in items],
                "top_logprobs": [{t["token"]: t["logprob"] for t in lp["top"][:self.top_logprobs]} for lp in items],
                "text_offset": offsets}


def tool_calls(pieces: Iterable[object]) -> list[ToolCall]:
    """The whole calls ([{id, type, function: {name, arguments}}]) from the ToolCallDelta pieces."""
    calls: dict[int, ToolCall] = {}
    for p in pieces:
        if isinstance(p, ToolCallDelta):
            call = calls.setdefault(p.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            call["id"] = call["id"] or p.id
            call["function"]["name"] = call["function"]["name"] or p.name
            call["function"]["arguments"] += p.arguments
    return [calls[i] for i in sorted(calls)]


def finish_reason(usage: Usage) -> str:
    return usage.finish_reason if usage.finish_reason in FINISH_REASONS else "stop"


def usage_map(usage: Usage) -> dict[str, int]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def grid_usage(usage: Usage) -> dict[str, Any]:
    """Where and how fast it ran: tower, TTFT (s), tokens/s, failovers."""
    return {"tower": usage.tower, "ttft_s": round(usage.ttft_s, 4), "tower_ttft_s": round(usage.tower_ttft_s, 4),
            "tokens_per_s": round(usage.tokens_per_s, 2), "failovers": usage.failovers}


def shortened(vector: Sequence[float], dimensions: int | None) -> list[float]:
    """The first ``dimensions`` numbers of an (L2-normalised) embedding, normalised
    again, as OpenAI and Ollama shorten embeddings; the whole vector for None."""
    if dimensions is None or dimensions >= len(vector):
        return list(vector)
    head = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in head)) or 1.0
    return [x / norm for x in head]


def embeddings(request: EmbedRequest, result: Embeddings) -> dict[str, Any]:
    """OpenAI's embeddings list for an openai_api.EmbedRequest and its client.Embeddings."""
    data = []
    for i, whole in enumerate(result.vectors):
        vector = shortened(whole, request.dimensions)
        value: str | list[float] = (base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
                                    if request.base64 else vector)
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": request.model,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
            "rngrid": {"tower": result.tower, "dims": result.dims}}
