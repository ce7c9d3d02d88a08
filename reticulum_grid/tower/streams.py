"""One token stream on a tower, for a whole model (daemon.py) or a split one
(split.py): admission, the queue turn, the stream to the client and the
mapping of every way it can end to the stream's end or error message.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from links.stream import StreamSender
from links.wire import Code, WireError
from reticulum_grid.inference.admission import Cancelled, ModelQueue, Ticket
from reticulum_grid.inference.generation import AdapterError, ContextLengthExceeded, Generation, Piece
from reticulum_grid.inference.placement import LoadError
from reticulum_grid.inference.runner import RunnerError

if TYPE_CHECKING:
    from reticulum_grid.tower.session import LinkSession

log = logging.getLogger("rngrid.tower")
#: A stream's usage map from its Generation and the seconds it was queued.
UsageMap = Callable[[Generation, float], dict[str, Any]]
#: generate(what prepare() gave, or None without one; the Generation to fill; the cancel event).
Generate = Callable[[Any, Generation, threading.Event], Iterable[Piece]]


class StreamRequest(Protocol):
    """What start_stream needs of a parsed request: the stream id it answers on."""
    @property
    def stream_id(self) -> int: ...


def start_stream(session: "LinkSession", request: StreamRequest, queue: ModelQueue,
                 generate: Generate, usage: UsageMap,
                 prepare: Callable[[], object] | None = None, on_error: Callable[[WireError], None] | None = None,
                 name: str = "rngrid-gen", budget: int | None = None) -> dict[str, Any]:
    """Admit ``request`` (a parsed inference request) to ``queue`` and run it on
    a thread of its own; returns the reply ``{"stream_id", "queued"}`` at once.

    ``prepare()`` runs first, before the request takes a slot (loading or
    restarting a runner, which may wait for the running streams to end), and
    its result goes to ``generate(prepared, result, cancel)``, which yields
    generation.Piece and fills ``result`` (a Generation); ``usage(result,
    queued_s)`` gives the end message's usage map; ``on_error(WireError)`` runs
    before a coded error is sent; ``budget``: the most tokens it may generate
    (its max_tokens; None for no token stream), which bounds the retry hint
    others are told while it runs (inference/admission.py). Raises
    WireError(busy) when the queue is full, WireError(bad_request) when the
    stream id is in use on this Link."""
    if request.stream_id in session.streams:
        raise WireError(Code.BAD_REQUEST, f"stream id {request.stream_id} is already in use on this link")
    ticket = queue.admit(budget)
    cancel = session.streams[request.stream_id] = threading.Event()
    threading.Thread(target=_run, args=(session, request, queue, ticket, cancel, prepare, generate, usage, on_error),
                     name=f"{name}-{request.stream_id}", daemon=True).start()
    return {"stream_id": request.stream_id, "queued": ticket.ahead}


def _run(session: "LinkSession", request: StreamRequest, queue: ModelQueue, ticket: Ticket, cancel: threading.Event,
         prepare: Callable[[], object] | None, generate: Generate, usage: UsageMap,
         on_error: Callable[[WireError], None] | None) -> None:
    sender = StreamSender(session.router, request.stream_id)
    started = time.perf_counter()
    try:
        try:
            prepared = prepare() if prepare else None
            with queue.turn(ticket, cancel):
                turn_at, turn_wall = time.perf_counter(), time.time()
                result = Generation()
                sent = 0
                for piece in generate(prepared, result, cancel):
                    sender.push(piece.data, piece.ids, _extra(piece))
                    ticket.progress(piece.n)
                    sent += piece.n
                generation_s = time.perf_counter() - turn_at
            released_at = time.time()
        except BaseException:
            queue.forget(ticket)
            raise
        if result.finish_reason == "cancelled":
            # The tower's own record of a stop (tests prove cancellation by it, not by a clock).
            log.info("stream %d: stopped for the client after %d token(s), %.2f s", request.stream_id, sent,
                     generation_s)
            sender.fail(Code.CANCELLED, "cancelled by the client")
        else:
            sender.end(result.finish_reason, usage(result, turn_at - started))
            # The tower's record of its slot's use (wall-clock s): tests read the order of turns from it.
            log.info("stream %d: %d token(s), admitted %.3f, turn %.3f-%.3f", request.stream_id, sent,
                     ticket.admitted_at, turn_wall, released_at)
        queue.record(generation_s, ticket.rate())  # the retry hint counts generation, never waiting
    except Cancelled:
        sender.fail(Code.CANCELLED, "cancelled while queued")
    except WireError as e:
        if on_error is not None:
            on_error(e)
        sender.fail(e.code, e.message)
    except Exception as e:
        error = coded(e)
        if error.code == Code.INTERNAL:
            log.exception("generation failed")
        sender.fail(error.code, error.message)
    finally:
        session.streams.pop(request.stream_id, None)


def coded(e: BaseException) -> WireError:
    """The WireError a failure of the engine becomes."""
    if isinstance(e, WireError):
        return e
    if isinstance(e, ContextLengthExceeded):
        return WireError(Code.CONTEXT_LENGTH_EXCEEDED, str(e))
    if isinstance(e, AdapterError):
        return WireError(Code.UNKNOWN_ADAPTER, str(e))
    if isinstance(e, ValueError) and not isinstance(e, LoadError):
        return WireError(Code.BAD_REQUEST, str(e))
    if isinstance(e, RunnerError):
        if e.status == 0:  # the runner died or went away mid-request; it is restarted
            return WireError(Code.RUNNER_LOST, f"the model's engine stopped: {e.message}")
        if e.status == 400:
            return WireError(Code.BAD_REQUEST, f"llama.cpp refused the request: {e.message}")
        return WireError(Code.INTERNAL, f"llama.cpp failed: {e.message}")
    if isinstance(e, LoadError):
        return WireError(Code.INTERNAL, f"the model did not load: {e}")
    return WireError(Code.INTERNAL, f"{type(e).__name__}: {e}")


def _extra(piece: Piece) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if piece.n != len(piece.ids):
        extra["n"] = piece.n
    if piece.logprobs:
        extra["lp"] = piece.logprobs
    if piece.tool_calls:
        extra["tc"] = piece.tool_calls
    if not piece.exact:
        extra["x"] = True
    return extra
