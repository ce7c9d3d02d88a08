"""``ai/inference`` and ``ai/embeddings`` through the Grid for an HTTP request: busy-wait and cancel.

Routing and failover are the Grid's (client/stream.py). Like ``rngrid infer``,
a request every tower answers "busy" waits up to ``busy_wait_s`` seconds for
room (client/busy.py: the earliest of the towers' retry hints, a tower
announcing a free slot or queue place, or the deadline) and is asked again;
busy always comes before any output, so a retry repeats nothing. When a last
ask at the deadline is busy too the caller gets that answer (an HTTP 429 whose
Retry-After is its hint). A client that leaves
stops the stream: the cancel reaches the tower at once (or ends the wait for
a slot), and the thread waiting on it wakes.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from reticulum_grid.client import Embeddings, Grid, Text, ToolCallDelta, Usage
from reticulum_grid.client.busy import BusyWait
from reticulum_grid.gateway.bridge import Reporter, Work, relay

#: What an inference stream yields before its end: text pieces and tool-call pieces.
Output = Text | ToolCallDelta
#: What an inference stream yields: Output pieces, then one Usage.
Piece = Output | Usage
#: A command's event (commands.py): a JSON map with its ``type``.
Event = dict[str, Any]
E = TypeVar("E")


def event_of(piece: Piece) -> Event:
    """The command API's event (a JSON map) for one stream piece: ``token``
    {text, logprobs?}, ``tool_call`` {index, id, name, arguments} or ``usage``."""
    if isinstance(piece, Usage):
        return {"type": "usage", **dataclasses.asdict(piece)}
    if isinstance(piece, ToolCallDelta):
        return {"type": "tool_call", **dataclasses.asdict(piece)}
    event: Event = {"type": "token", "text": str(piece)}
    if getattr(piece, "logprobs", ()):
        event["logprobs"] = list(piece.logprobs)
    return event


def ended(pieces: list[Piece]) -> tuple[list[Output], Usage]:
    """(the pieces before the Usage, the Usage) of a whole stream. Raises
    RuntimeError when the last is no Usage (a Grid's stream always ends with one)."""
    if not pieces or not isinstance(pieces[-1], Usage):
        raise RuntimeError("an inference stream ended without its Usage")
    return [p for p in pieces[:-1] if not isinstance(p, Usage)], pieces[-1]


def inference_work(grid: Grid, payload: dict[str, Any], tower: str | None, busy_wait_s: float) -> Work[Piece]:
    """``work(call)`` for a bridge.Call: emits the stream's pieces (Text,
    ToolCallDelta, then one Usage). Raises WireError."""
    return _streamed(grid, payload, tower, busy_wait_s, lambda piece: piece)


def inference_events(grid: Grid, payload: dict[str, Any], tower: str | None, busy_wait_s: float) -> Work[Event]:
    """inference_work with each piece as its event_of map."""
    return _streamed(grid, payload, tower, busy_wait_s, event_of)


def _streamed(grid: Grid, payload: dict[str, Any], tower: str | None, busy_wait_s: float,
              shape: Callable[[Piece], E]) -> Work[E]:
    def work(call: Reporter[E]) -> None:
        stream = grid.infer(payload, tower=tower, busy_wait=busy_wait_s)
        call.on_stop(stream.cancel)
        relay(iter(stream), call, shape)  # leaving early cancels the stream on the tower

    return work


def embeddings_work(grid: Grid, model: str, texts: list[str], tower: str | None,
                    busy_wait_s: float) -> Work[Embeddings]:
    """``work(call)`` for a bridge.Call: emits one client.Embeddings. Raises WireError."""
    return _embedded(grid, model, texts, tower, busy_wait_s, lambda result: result)


def embeddings_event(grid: Grid, model: str, texts: list[str], tower: str | None,
                     busy_wait_s: float) -> Work[Event]:
    """embeddings_work emitting the map {"type": "embeddings", "vectors", "dims",
    "prompt_tokens", "tower"}."""
    return _embedded(grid, model, texts, tower, busy_wait_s, lambda result: {
        "type": "embeddings", "vectors": result.vectors, "dims": result.dims, "prompt_tokens": result.prompt_tokens,
        "tower": result.tower})


def _embedded(grid: Grid, model: str, texts: list[str], tower: str | None, busy_wait_s: float,
              shape: Callable[[Embeddings], E]) -> Work[E]:
    def work(call: Reporter[E]) -> None:
        wait = BusyWait(grid, busy_wait_s)
        call.on_stop(wait.stop)
        call.emit(shape(grid.embed(model, texts, tower=tower, busy_wait=wait)))

    return work
