"""`jobs watch` progress is thinned to what the Link carries (tower/jobs.py
WatchSender), shown with a test double for the Link's Channel router whose
sends take as long as a slow radio link's."""

import threading
import time
from types import SimpleNamespace

from reticulum_grid.tower.jobs import PROGRESS_RTTS, WatchSender


class SlowRouterDouble:
    """Stands in for links.channel.ChannelRouter: each send takes ``send_s``."""

    def __init__(self, rtt, send_s):
        self.link = SimpleNamespace(rtt=rtt)
        self.send_s = send_s
        self.events = []
        self.done = threading.Event()

    def send(self, message):
        time.sleep(self.send_s)
        self.events.append((time.monotonic(), message.event))
        if message.event.get("type") == "end":
            self.done.set()
        return True


def test_progress_is_thinned_but_order_and_ends_are_kept():
    router = SlowRouterDouble(rtt=0.05, send_s=0.05)
    sender = WatchSender(router, watch_id=1)
    sender({"type": "started"})
    began = time.monotonic()
    for step in range(1, 41):  # a fast job: 40 steps in ~0.4 s (longer on a loaded machine)
        sender({"type": "progress", "step": step})
        time.sleep(0.01)
    sender({"type": "end", "state": "succeeded", "step": 40})
    stepped_s = time.monotonic() - began
    assert router.done.wait(30)
    kinds = [e["type"] for _, e in router.events]
    steps = [e["step"] for _, e in router.events if e["type"] == "progress"]
    assert kinds[0] == "started" and kinds[-1] == "end"
    assert steps == sorted(steps) and steps[-1] == 40  # the newest progress before the end is never dropped
    # One per 4 RTTs (0.2 s) over the time the steps took here, plus the first and the last.
    assert len(steps) <= stepped_s / (PROGRESS_RTTS * 0.05) + 2, (steps, stepped_s)
    times = [t for t, e in router.events if e["type"] == "progress"]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(g >= PROGRESS_RTTS * 0.05 * 0.9 for g in gaps), gaps
    assert sender.dropped == 40 - len(steps)


def test_fast_link_gets_every_progress_event():
    router = SlowRouterDouble(rtt=0.0005, send_s=0.0)
    sender = WatchSender(router, watch_id=2)
    for step in range(1, 11):
        sender({"type": "progress", "step": step})
        time.sleep(0.02)
    sender({"type": "end", "state": "succeeded"})
    assert router.done.wait(30)
    assert [e["step"] for _, e in router.events if e["type"] == "progress"] == list(range(1, 11))
