"""Admission for one loaded model: as many streams as the runner has slots, a bounded line waits.

A runner serves ``slots`` generations at once (llama-server's parallel slots,
batched together); up to ``queue_depth`` more requests wait their turn, first
come first served, and the next one starts the moment a slot frees. Beyond
that the tower answers "busy" with a retry hint: the time until a slot frees
for it, estimated from how long generations take (their own time, never the
time they waited: a hint that counted waiting would grow with the line).

``drain()`` holds new turns back until every running stream ended, for the
moments a runner must restart between requests (an adapter or embeddings it
was not started with).
"""

import contextlib
import math
import threading
from collections import deque

from links.wire import Code, WireError


class Cancelled(Exception):
    pass


class Ticket:
    """A place in line; ``ahead`` is how many requests were before it."""
    __slots__ = ("ahead",)

    def __init__(self, ahead):
        self.ahead = ahead


class ModelQueue:
    """``slots``: streams at once; ``queue_depth``: requests that may wait;
    ``initial_request_s``: the first guess of one generation's time (seconds)."""

    def __init__(self, queue_depth=4, slots=1, initial_request_s=5.0):
        self.queue_depth = queue_depth
        self.slots = slots
        self.running = 0
        self.avg_request_s = initial_request_s
        self._line = deque()
        self._draining = 0
        self._cond = threading.Condition()

    @property
    def waiting(self):
        return len(self._line)

    @property
    def free(self):
        """Slots free now (announced in caps)."""
        return max(0, self.slots - self.running)

    def set_slots(self, slots):
        with self._cond:
            self.slots = max(1, slots)
            self._cond.notify_all()

    def admit(self):
        """A Ticket for a place in line; raises WireError(busy) when every slot
        runs and the line is full."""
        with self._cond:
            ahead = self.running + len(self._line)
            if ahead >= self.slots + self.queue_depth:
                raise WireError(Code.BUSY, f"{self.running} running, {len(self._line)} waiting: the queue is full",
                                retry_after=self.retry_hint(len(self._line) + 1))
            ticket = Ticket(max(0, ahead - self.slots + 1))
            self._line.append(ticket)
            return ticket

    def retry_hint(self, position):
        """Seconds until the ``position``-th request in line (1: the next) gets a slot."""
        return round(math.ceil(position / max(1, self.slots)) * self.avg_request_s, 1)

    @contextlib.contextmanager
    def turn(self, ticket, cancel, poll_s=0.1):
        """Wait for ``ticket``'s turn; raises Cancelled if ``cancel`` is set first."""
        with self._cond:
            while self._draining or self.running >= self.slots or self._line[0] is not ticket:
                if cancel.is_set():
                    self._line.remove(ticket)
                    self._cond.notify_all()
                    raise Cancelled()
                self._cond.wait(poll_s)
            self._line.popleft()
            self.running += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self.running -= 1
                self._cond.notify_all()

    def forget(self, ticket):
        """Take ``ticket`` out of the line if it is still there (its request
        failed before its turn)."""
        with self._cond:
            if ticket in self._line:
                self._line.remove(ticket)
                self._cond.notify_all()

    @contextlib.contextmanager
    def drain(self):
        """Hold new turns back until no stream runs, then run the block (the
        caller holds no turn itself)."""
        with self._cond:
            self._draining += 1
            while self.running:
                self._cond.wait(0.1)
        try:
            yield
        finally:
            with self._cond:
                self._draining -= 1
                self._cond.notify_all()

    def record(self, seconds):
        """Feed a finished generation's duration (seconds, from its turn) into the retry hint."""
        with self._cond:
            self.avg_request_s = 0.8 * self.avg_request_s + 0.2 * seconds
