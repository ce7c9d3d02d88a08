"""Admission for one loaded model: one generation runs, a bounded line waits.

A llama context serves one generation at a time. Up to ``queue_depth``
requests wait their turn, first come first served; beyond that the tower
answers "busy" with a retry hint (seconds) instead of queueing without bound.
The next request starts the moment the previous one ends.
"""

import contextlib
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
    def __init__(self, queue_depth=4, initial_request_s=5.0):
        self.queue_depth = queue_depth
        self.running = 0
        self.avg_request_s = initial_request_s
        self._line = deque()
        self._cond = threading.Condition()

    @property
    def waiting(self):
        return len(self._line)

    def admit(self):
        """A Ticket for a place in line; raises WireError(busy) when the line is full."""
        with self._cond:
            ahead = self.running + len(self._line)
            if ahead > self.queue_depth:
                raise WireError(Code.BUSY, f"{ahead} requests ahead, queue is full",
                                retry_after=round(ahead * self.avg_request_s, 1))
            ticket = Ticket(ahead)
            self._line.append(ticket)
            return ticket

    @contextlib.contextmanager
    def turn(self, ticket, cancel, poll_s=0.1):
        """Wait for ``ticket``'s turn; raises Cancelled if ``cancel`` is set first."""
        with self._cond:
            while self.running or self._line[0] is not ticket:
                if cancel.is_set():
                    self._line.remove(ticket)
                    self._cond.notify_all()
                    raise Cancelled()
                self._cond.wait(poll_s)
            self._line.popleft()
            self.running += 1
        try:
            yield
        finally:
            with self._cond:
                self.running -= 1
                self._cond.notify_all()

    def record(self, seconds):
        """Feed a finished request's duration into the retry-hint estimate."""
        with self._cond:
            self.avg_request_s = 0.8 * self.avg_request_s + 0.2 * seconds
