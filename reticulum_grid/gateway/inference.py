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

from reticulum_grid.client import ToolCallDelta, Usage
from reticulum_grid.client.busy import BusyWait


def event_of(piece):
    """The command API's event (a JSON map) for one stream piece: ``token``
    {text, logprobs?}, ``tool_call`` {index, id, name, arguments} or ``usage``."""
    if isinstance(piece, Usage):
        return {"type": "usage", **dataclasses.asdict(piece)}
    if isinstance(piece, ToolCallDelta):
        return {"type": "tool_call", **dataclasses.asdict(piece)}
    event = {"type": "token", "text": str(piece)}
    if getattr(piece, "logprobs", ()):
        event["logprobs"] = list(piece.logprobs)
    return event


def inference_work(grid, payload, tower, busy_wait_s, as_events=False):
    """``work(call)`` for a bridge.Call: emits the stream's pieces (Text,
    ToolCallDelta, then one Usage), or with ``as_events`` their event_of maps.
    Raises WireError."""

    def work(call):
        stream = grid.execute("ai/inference", payload, tower=tower, busy_wait=busy_wait_s)
        call.on_stop(stream.cancel)
        pieces = iter(stream)
        try:
            for piece in pieces:
                if call.stopped.is_set():
                    return
                call.emit(event_of(piece) if as_events else piece)
        finally:
            pieces.close()  # leaving early cancels the stream on the tower

    return work


def embeddings_work(grid, model, texts, tower, busy_wait_s, as_event=False):
    """``work(call)`` for a bridge.Call: emits one client.Embeddings (or with
    ``as_event`` the map {"type": "embeddings", "vectors", "dims", "prompt_tokens",
    "tower"}). Raises WireError."""

    def work(call):
        wait = BusyWait(grid, busy_wait_s)
        call.on_stop(wait.stop)
        result = grid.embed(model, texts, tower=tower, busy_wait=wait)
        call.emit({"type": "embeddings", "vectors": result.vectors, "dims": result.dims,
                   "prompt_tokens": result.prompt_tokens, "tower": result.tower} if as_event else result)

    return work

