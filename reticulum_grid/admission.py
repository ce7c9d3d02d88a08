"""Admission for one loaded model: one generation runs, a bounded queue waits.

A llama context serves one generation at a time. Up to ``queue_depth``
requests may wait their turn; beyond that the tower answers "busy" with a
retry hint (seconds) instead of queueing without bound.
"""

import contextlib
import threading

from links.wire import Code, WireError


class Cancelled(Exception):
    pass


class ModelQueue:
    def __init__(self, queue_depth=4, initial_request_s=5.0):
        self.queue_depth = queue_depth
        self.running = 0
        self.waiting = 0
        self.avg_request_s = initial_request_s
        self._counts = threading.Lock()
        self._turn = threading.Lock()

    def admit(self):
        """Reserve a place. Returns the number of requests ahead; raises WireError(busy)."""
        with self._counts:
            ahead = self.running + self.waiting
            if ahead > self.queue_depth:
                raise WireError(Code.BUSY, f"{ahead} requests ahead, queue is full",
                                retry_after=round(ahead * self.avg_request_s, 1))
            self.waiting += 1
            return ahead

    def release_unstarted(self):
        """Give back a place taken by admit() for a request that will not run."""
        with self._counts:
            self.waiting -= 1

    @contextlib.contextmanager
    def turn(self, cancel, poll_s=0.1):
        """Wait for this admitted request's turn; raises Cancelled if ``cancel`` is set first."""
        while not self._turn.acquire(timeout=poll_s):
            if cancel.is_set():
                self.release_unstarted()
                raise Cancelled()
        with self._counts:
            self.waiting -= 1
            self.running += 1
        try:
            yield
        finally:
            with self._counts:
                self.running -= 1
            self._turn.release()

    def record(self, seconds):
        """Feed a finished request's duration into the retry-hint estimate."""
        with self._counts:
            self.avg_request_s = 0.8 * self.avg_request_s + 0.2 * seconds
