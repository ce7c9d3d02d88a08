"""Admission for one loaded model: as many streams as the runner has slots, a bounded line waits.

A runner serves ``slots`` generations at once (llama-server's parallel slots,
batched together); up to ``queue_depth`` more requests wait their turn, first
come first served, and the next one starts the moment a slot frees. Beyond
that the tower answers "busy" with a retry hint: the time until a place in
the line opens, i.e. until the stream that started first is expected to end,
estimated from how long generations take (their own time, never the time
they waited: a hint that counted waiting would grow with the line). A client
that asks again then is taken into the line before it runs dry, so the slots
never idle while clients wait outside (tests/test_busy.py). ``on_change()``
runs whenever the model goes from no free slot to some or back (the tower
re-announces then, so waiting clients hear of a free slot at once).

``drain()`` holds new turns back until every running stream ended, for the
moments a runner must restart between requests (an adapter or embeddings it
was not started with).
"""

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from links.wire import Code, WireError


class Cancelled(Exception):
    pass


class Ticket:
    """A place in line; ``ahead`` is how many requests were before it;
    ``admitted_at``: when it was given (wall clock, seconds)."""
    __slots__ = ("ahead", "admitted_at")

    def __init__(self, ahead: int) -> None:
        self.ahead = ahead
        self.admitted_at = time.time()


#: Shortest retry hint (seconds): a stream running past its expected end
#: still frees its slot some time later; sooner hints only make clients spin.
MIN_HINT_S = 0.5


class ModelQueue:
    """``slots``: streams at once; ``queue_depth``: requests that may wait;
    ``initial_request_s``: the guess of one generation's time (seconds) until one was timed;
    ``on_change()``: called (outside the lock) when free slots go from 0 to
    some or from some to 0."""

    def __init__(self, queue_depth: int = 4, slots: int = 1, initial_request_s: float = 5.0,
                 on_change: Callable[[], None] | None = None) -> None:
        self.queue_depth = queue_depth
        self.slots = slots
        self.running = 0
        self.avg_request_s = initial_request_s
        self.on_change = on_change
        self._line: deque[Ticket] = deque()
        self._started: list[float] = []  # time.monotonic() at which each running stream took its slot
        self._timed = False  # a generation was recorded (avg_request_s is no longer the first guess)
        self._free_told = True  # what on_change last reported: some slot free
        self._draining = 0
        self._cond = threading.Condition()

    @property
    def waiting(self) -> int:
        return len(self._line)

    @property
    def free(self) -> int:
        """Slots free now (announced in caps)."""
        return max(0, self.slots - self.running)

    def set_slots(self, slots: int) -> None:
        with self._cond:
            self.slots = max(1, slots)
            self._cond.notify_all()
            changed = self._flipped()
        self._changed(changed)

    def _flipped(self) -> bool:
        """Whether "some slot is free" differs from when on_change last ran (the lock is held)."""
        free = self.free > 0
        if free == self._free_told:
            return False
        self._free_told = free
        return True

    def _changed(self, changed: bool) -> None:
        if changed and self.on_change is not None:
            self.on_change()

    def admit(self) -> Ticket:
        """A Ticket for a place in line; raises WireError(busy) when every slot
        runs and the line is full."""
        with self._cond:
            ahead = self.running + len(self._line)
            if ahead >= self.slots + self.queue_depth:
                raise WireError(Code.BUSY, f"{self.running} running, {len(self._line)} waiting: the queue is full",
                                retry_after=self.retry_hint())
            ticket = Ticket(max(0, ahead - self.slots + 1))
            self._line.append(ticket)
            return ticket

    def retry_hint(self, now: float | None = None) -> float:
        """Seconds until a place in the line opens: until the running stream
        that took its slot first is expected to end (the line then moves up
        one), at least MIN_HINT_S. The lock is held or the caller does not mind."""
        now = time.monotonic() if now is None else now
        oldest = min(self._started, default=now)
        return round(max(MIN_HINT_S, self.avg_request_s - (now - oldest)), 1)

    @contextlib.contextmanager
    def turn(self, ticket: Ticket, cancel: threading.Event, poll_s: float = 0.1) -> Iterator[None]:
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
            started = time.monotonic()
            self._started.append(started)
            self._cond.notify_all()
            changed = self._flipped()
        self._changed(changed)
        try:
            yield
        finally:
            with self._cond:
                self.running -= 1
                self._started.remove(started)
                self._cond.notify_all()
                changed = not self._line and self._flipped()  # else the next in line takes it at once
            self._changed(changed)

    def forget(self, ticket: Ticket) -> None:
        """Take ``ticket`` out of the line if it is still there (its request
        failed before its turn)."""
        with self._cond:
            if ticket in self._line:
                self._line.remove(ticket)
                self._cond.notify_all()

    @contextlib.contextmanager
    def drain(self) -> Iterator[None]:
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

    def record(self, seconds: float) -> None:
        """Feed a finished generation's duration (seconds, from its turn) into the
        retry hint; the first one replaces the initial guess."""
        with self._cond:
            self.avg_request_s = seconds if not self._timed else 0.8 * self.avg_request_s + 0.2 * seconds
            self._timed = True
