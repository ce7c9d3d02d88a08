"""An RNS announce handler that records when each tower announce reached this
process, by ``clock`` (seconds): used by tests and by bench/route.py."""

import time

from announce.announcer import APP_NAME, TOWER_ASPECT


class Arrivals:
    aspect_filter = f"{APP_NAME}.{TOWER_ASPECT}"
    receive_path_responses = False

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.times = {}  # destination hash -> [arrival times]

    def received_announce(self, destination_hash, announced_identity, app_data):
        self.times.setdefault(destination_hash, []).append(self.clock())
