"""One token stream on a tower, for a whole model (daemon.py) or a split one
(split.py): admission, the queue turn, the stream to the client and the
mapping of every way it can end to the stream's end or error message.
"""

import logging
import threading
import time

from links.stream import StreamSender
from links.wire import Code, WireError
from reticulum_grid.inference.admission import Cancelled
from reticulum_grid.inference.llama_backend import AdapterError, Generation

log = logging.getLogger("rngrid.tower")


def start_stream(session, request, queue, generate, usage, on_error=None, name="rngrid-gen"):
    """Admit ``request`` (a parsed inference request) to ``queue`` and run it on
    a thread of its own; returns the reply ``{"stream_id", "queued"}`` at once.

    ``generate(result, cancel)`` yields (text bytes, token ids) and fills
    ``result`` (a Generation); ``usage(result, queued_s)`` gives the end
    message's usage map; ``on_error(WireError)`` runs before a coded error is
    sent. Raises WireError(busy) when the queue is full, WireError(bad_request)
    when the stream id is in use on this Link."""
    if request.stream_id in session.streams:
        raise WireError(Code.BAD_REQUEST, f"stream id {request.stream_id} is already in use on this link")
    ticket = queue.admit()
    cancel = session.streams[request.stream_id] = threading.Event()
    threading.Thread(target=_run, args=(session, request, queue, ticket, cancel, generate, usage, on_error),
                     name=f"{name}-{request.stream_id}", daemon=True).start()
    return {"stream_id": request.stream_id, "queued": ticket.ahead}


def _run(session, request, queue, ticket, cancel, generate, usage, on_error):
    sender = StreamSender(session.router, request.stream_id)
    started = time.perf_counter()
    try:
        with queue.turn(ticket, cancel):
            queued_s = time.perf_counter() - started
            result = Generation()
            for piece, ids in generate(result, cancel):
                sender.push(piece, ids)
        if result.finish_reason == "cancelled":
            sender.fail(Code.CANCELLED, "cancelled by the client")
        else:
            sender.end(result.finish_reason, usage(result, queued_s))
        queue.record(time.perf_counter() - started)
    except Cancelled:
        sender.fail(Code.CANCELLED, "cancelled while queued")
    except WireError as e:
        if on_error is not None:
            on_error(e)
        sender.fail(e.code, e.message)
    except AdapterError as e:
        sender.fail(Code.UNKNOWN_ADAPTER, str(e))
    except Exception as e:
        log.exception("generation failed")
        sender.fail(Code.INTERNAL, f"{type(e).__name__}: {e}")
    finally:
        session.streams.pop(request.stream_id, None)
