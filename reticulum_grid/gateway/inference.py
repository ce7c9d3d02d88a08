"""``ai/inference`` through the Grid for an HTTP request: busy-retry and cancel.

Routing and failover are the Grid's (client/stream.py). Like ``rngrid infer``,
a request every tower answers "busy" is tried again as the towers' retry hints
say, for up to ``busy_wait_s`` seconds; busy always comes before any output,
so a retry repeats nothing. After that the caller gets the busy error (an
HTTP 429 with Retry-After). A client that leaves stops the stream: the
cancel reaches the tower at once, and the thread waiting on it wakes.
"""

import dataclasses
import time

from links.wire import Code, WireError
from reticulum_grid.client import Usage

#: Shortest pause between two tries while every tower is busy (seconds).
MIN_BUSY_PAUSE_S = 0.5


def inference_work(grid, payload, tower, busy_wait_s, as_events=False):
    """``work(call)`` for a bridge.Call: emits the text pieces (str) and then
    one Usage, or with ``as_events`` the maps {"type": "token", "text"} and
    {"type": "usage", ...Usage fields}. Raises WireError."""

    def emit(call, piece):
        if not as_events:
            call.emit(piece)
        elif isinstance(piece, Usage):
            call.emit({"type": "usage", **dataclasses.asdict(piece)})
        else:
            call.emit({"type": "token", "text": piece})

    def work(call):
        deadline = time.monotonic() + busy_wait_s
        while not call.stopped.is_set():
            stream = grid.execute("ai/inference", payload, tower=tower)
            call.on_stop(stream.cancel)
            pieces = iter(stream)
            try:
                try:
                    first = next(pieces)
                except WireError as e:
                    pause = max(MIN_BUSY_PAUSE_S, e.retry_after or 0.0)
                    if e.code != Code.BUSY or call.stopped.is_set() or time.monotonic() + pause > deadline:
                        raise
                    call.stopped.wait(pause)
                    continue
                emit(call, first)
                for piece in pieces:
                    if call.stopped.is_set():
                        return
                    emit(call, piece)
                return
            finally:
                pieces.close()  # leaving early cancels the stream on the tower

    return work
