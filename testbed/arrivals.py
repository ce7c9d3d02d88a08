"""An RNS announce handler that records when each tower announce reached this
process, by ``clock`` (seconds): used by tests and by bench/route.py; and the
tower's own record of when it announced (its log), free of delivery delays."""

import re
import time
from datetime import datetime

from announce.announcer import APP_NAME, TOWER_ASPECT

_ANNOUNCED = re.compile(r"^(\S+ \S+) rngrid.announce INFO announced \((.*?)\)", re.M)


def announced(log):
    """[(wall-clock seconds, reason)] of every announce a tower's log records
    (1 ms resolution), oldest first."""
    return [(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), m.group(2))
            for m in _ANNOUNCED.finditer(log)]


class Arrivals:
    aspect_filter = f"{APP_NAME}.{TOWER_ASPECT}"
    receive_path_responses = False

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.times = {}  # destination hash -> [arrival times]

    def received_announce(self, destination_hash, announced_identity, app_data):
        self.times.setdefault(destination_hash, []).append(self.clock())
