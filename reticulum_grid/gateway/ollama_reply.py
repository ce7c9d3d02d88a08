"""Ollama's response shapes (api/types.go) for what the grid has and streams back.

``Reply`` builds one chat or generate request's NDJSON objects: the pieces
(``message.content`` or ``response``, ``logprobs``), whole tool calls
(``message.tool_calls`` with JSON arguments: Ollama sends a call once it is
complete, never in fragments), and the last object with ``done``,
``done_reason`` and Ollama's metrics (``metrics``). ``tags``, ``show`` and ``ps`` build the model listings from the
towers' caps/full (client/models.TowerModel). Every reply carries an extra
``rngrid`` object: which tower ran it, or holds the model.
"""

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from announce.capsfull import ModelSummary
from reticulum_grid.client import Embeddings, ToolCallDelta, Usage
from reticulum_grid.client.models import TowerModel
from reticulum_grid.gateway.errors import ApiError
from reticulum_grid.gateway.inference import Output
from reticulum_grid.gateway.openai_reply import grid_usage, tool_calls

NS = 1_000_000_000
#: A loaded model's expiry in /api/ps: towers keep models loaded until another
#: needs the memory, so far ahead (Ollama's CLI shows "Forever").
NEVER_EXPIRES = timedelta(days=365 * 100)


def nanoseconds(seconds: float) -> int:
    """Ollama's durations: whole nanoseconds, rounded down (so parts never add up to more than their whole)."""
    return int(seconds * NS)


def timestamp(seconds: float | None = None) -> str:
    """RFC 3339 UTC time, as Ollama's ``created_at`` (seconds: Unix time; default now)."""
    at = datetime.fromtimestamp(time.time() if seconds is None else seconds, timezone.utc)
    return at.isoformat().replace("+00:00", "Z")


class Reply:
    """The NDJSON objects of one request; ``chat``: /api/chat (else /api/generate);
    ``started``: time.perf_counter() when the request came; ``top_logprobs``:
    alternatives per token to show (None: no logprobs)."""

    def __init__(self, chat: bool, model: str, started: float, top_logprobs: int | None = None) -> None:
        self.chat, self.model, self.started, self.top_logprobs = chat, model, started, top_logprobs
        self._calls: list[ToolCallDelta] = []  # pieces of calls not sent yet

    def _object(self, text: str = "", calls: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
        obj: dict[str, Any] = {"model": self.model, "created_at": timestamp()}
        if self.chat:
            obj["message"] = {"role": "assistant", "content": text}
            if calls:
                obj["message"]["tool_calls"] = calls
        else:
            obj["response"] = text
        return obj | extra

    def pieces(self, piece: str | ToolCallDelta) -> list[dict[str, Any]]:
        """The objects (0 or 1) to send for one stream piece: text now; a tool
        call's fragments are held until the call is whole (its index moves on, or the end)."""
        if isinstance(piece, ToolCallDelta):
            out = self._flush() if self._calls and piece.index != self._calls[-1].index else []
            self._calls.append(piece)
            return out
        out = self._flush()
        logprobs = self._logprobs([piece])
        return out + [self._object(str(piece), done=False, **({"logprobs": logprobs} if logprobs else {}))]

    def _flush(self) -> list[dict[str, Any]]:
        if not self._calls:
            return []
        calls, self._calls = ollama_calls(self._calls), []
        return [self._object("", calls=calls, done=False)]

    def last(self, usage: Usage) -> list[dict[str, Any]]:
        """The objects that end a stream: held tool calls, then ``done`` with the metrics."""
        return self._flush() + [self._object("", done=True, **self.metrics(usage))]

    def whole(self, pieces: Sequence[Output], usage: Usage) -> dict[str, Any]:
        """The one object of ``stream: false``: the text, the tool calls and the metrics."""
        text = "".join(p for p in pieces if isinstance(p, str))
        logprobs = self._logprobs(pieces)
        calls = ollama_calls([p for p in pieces if isinstance(p, ToolCallDelta)])
        return self._object(text, calls=calls, done=True, **self.metrics(usage),
                            **({"logprobs": logprobs} if logprobs else {}))

    def loaded(self, reason: str = "load") -> dict[str, Any]:
        """Ollama's answer to a request without messages or prompt (it loads the model)."""
        return self._object("", done=True, done_reason=reason)

    def metrics(self, usage: Usage) -> dict[str, Any]:
        """done_reason and Ollama's metrics (nanoseconds, token counts), plus ``rngrid``.

        ``total_duration`` runs from the request's arrival here to now; the
        others are the tower's spans one after another (links/usage.py), so
        they never add up to more: ``load_duration`` its ``queued_s`` (loading
        the runner and waiting for a slot, as Ollama's runs until its scheduler
        hands over a runner), ``prompt_eval_duration`` and ``eval_duration``
        the engine's own times reading the prompt and generating."""
        return {"done_reason": "length" if usage.finish_reason == "length" else "stop",
                "total_duration": nanoseconds(time.perf_counter() - self.started),
                "load_duration": nanoseconds(usage.queued_s),
                "prompt_eval_count": usage.prompt_tokens, "prompt_eval_duration": nanoseconds(usage.prompt_s),
                "eval_count": usage.completion_tokens, "eval_duration": nanoseconds(usage.decode_s),
                "rngrid": grid_usage(usage)}

    def _logprobs(self, pieces: Iterable[object]) -> list[dict[str, Any]] | None:
        """[{token, logprob, bytes, top_logprobs: [...]}] of the pieces' tokens (None: not asked)."""
        if self.top_logprobs is None:
            return None
        return [{"token": lp["token"], "logprob": lp["logprob"], "bytes": lp["bytes"],
                 "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                                  for t in lp["top"][:self.top_logprobs]]}
                for p in pieces if isinstance(p, str) for lp in getattr(p, "logprobs", ())]


def ollama_calls(deltas: Iterable[ToolCallDelta]) -> list[dict[str, Any]]:
    """Whole tool calls in Ollama's shape ([{id, function: {index, name, arguments: {...}}}])
    from ToolCallDelta pieces. Raises ApiError(502) for arguments that are not a JSON object."""
    out: list[dict[str, Any]] = []
    for call in tool_calls(deltas):
        text = call["function"]["arguments"] or "{}"
        try:
            arguments = json.loads(text)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ApiError(502, f"the model called {call['function']['name']!r} with arguments that are not a JSON "
                                f"object: {text[:200]!r}", code="bad_tool_call")
        out.append({"id": call["id"], "function": {"index": len(out), "name": call["function"]["name"],
                                                   "arguments": arguments}})
    return out


# -- what the grid has ------------------------------------------------------
def _size(parameters: int | None) -> str:
    """Ollama's parameter_size ("134.5M", "7.6B")."""
    if not parameters:
        return ""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if parameters >= scale:
            return f"{parameters / scale:.1f}{unit}"
    return str(parameters)


def details(facts: ModelSummary) -> dict[str, Any]:
    """Ollama's ModelDetails from a model's GGUF facts (a capsfull.ModelSummary)."""
    arch = facts.architecture or ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else [],
            "parameter_size": _size(facts.parameters), "quantization_level": facts.quantization or ""}


def capabilities(facts: ModelSummary) -> list[str]:
    """What a model can be asked for: an embedding model (one with pooling) only
    embeds; others complete and call tools (a tower constrains a model whose
    template knows no tools to a well-formed call)."""
    return ["embedding"] if facts.pooling else ["completion", "tools"]


def _grouped(rows: Iterable[TowerModel]) -> dict[str, list[TowerModel]]:
    """{alias: [TowerModel, ...]} of the models (not adapters), first heard first."""
    found: dict[str, list[TowerModel]] = {}
    for row in rows:
        if row.kind == "model":
            found.setdefault(row.alias, []).append(row)
    return found


def _facts(rows: Iterable[TowerModel]) -> ModelSummary:
    """The first GGUF summary a tower of ``rows`` read (an empty one before any did)."""
    return next((r.gguf for r in rows if r.gguf is not None), ModelSummary())


def tags(rows: Iterable[TowerModel], heard_at: Mapping[str, float]) -> dict[str, Any]:
    """``/api/tags``: one entry per model alias. ``heard_at``: {tower name: Unix
    time it was last heard}, given as ``modified_at`` (the grid keeps no file times)."""
    out = []
    for alias, same in sorted(_grouped(rows).items()):
        facts = _facts(same)
        out.append({"name": f"{alias}:latest", "model": f"{alias}:latest",
                    "modified_at": timestamp(max(heard_at.get(r.tower, 0.0) for r in same)),
                    "size": same[0].size, "digest": same[0].hex, "details": details(facts),
                    "capabilities": capabilities(facts),
                    "rngrid": {"towers": [{"name": r.tower, "loaded": r.loaded} for r in same]}})
    return {"models": out}


def show(alias: str, rows: Iterable[TowerModel], heard_at: Mapping[str, float],
         adapter: str | None = None) -> dict[str, Any] | None:
    """``/api/show`` for ``alias`` (its TowerModel rows on the towers), or None when no tower has it."""
    same = _grouped(rows).get(alias)
    if not same:
        return None
    facts = _facts(same)
    arch = facts.architecture or ""
    info = {"general.architecture": arch, "general.parameter_count": facts.parameters,
            "general.name": facts.name, f"{arch}.context_length": facts.context_length,
            f"{arch}.embedding_length": facts.embedding_length, f"{arch}.block_count": facts.block_count} if arch else {}
    towers = [{"name": r.tower, "loaded": r.loaded, "n_ctx": r.n_ctx, "slots": r.slots, "slots_free": r.slots_free}
              for r in same]
    return {"modelfile": f"# served by the grid: blob {same[0].hex}\nFROM {alias}\n", "parameters": "",
            "template": "", "details": details(facts),
            "model_info": {k: v for k, v in info.items() if v is not None},
            "capabilities": capabilities(facts),
            "modified_at": timestamp(max(heard_at.get(r.tower, 0.0) for r in same)),
            "rngrid": {"blob": same[0].hex, "adapter": adapter, "towers": towers}}


def ps(rows: Iterable[TowerModel]) -> dict[str, Any]:
    """``/api/ps``: every loaded model on every tower: memory (bytes; ``size_vram``
    on the GPUs), the slots' context and, in ``rngrid``, the tower and its slots."""
    expires = timestamp(time.time() + NEVER_EXPIRES.total_seconds())
    out = []
    for row in rows:
        if row.kind != "model" or not row.loaded:
            continue
        out.append({"name": f"{row.alias}:latest", "model": f"{row.alias}:latest", "size": row.memory_bytes,
                    "digest": row.hex, "details": details(row.gguf or ModelSummary()), "expires_at": expires,
                    "size_vram": row.gpu_mib * (1 << 20), "context_length": row.n_ctx,
                    "rngrid": {"tower": row.tower, "slots": row.slots, "slots_free": row.slots_free,
                               "on_gpu": row.on_gpu, "gpu_mib": row.gpu_mib, "host_mib": row.host_mib}})
    return {"models": out}


def embed(model: str, result: Embeddings, vectors: list[list[float]], started: float) -> dict[str, Any]:
    """``/api/embed``'s answer for a client.Embeddings (``vectors``: shortened as
    asked): ``total_duration`` from ``started`` (time.perf_counter()) to now,
    ``load_duration`` the tower's time before it computed them (see Reply.metrics)."""
    return {"model": model, "embeddings": vectors, "total_duration": nanoseconds(time.perf_counter() - started),
            "load_duration": nanoseconds(result.queued_s), "prompt_eval_count": result.prompt_tokens,
            "rngrid": {"tower": result.tower, "dims": result.dims}}
