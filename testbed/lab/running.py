"""How a lab process (a relay, the bridge, a transport node) runs: it prints the
line the lab waits for, then serves until SIGTERM or SIGINT."""

import signal
import threading


def serve_until_signalled(ready, stop=None):
    """Print ``ready``, then return once SIGTERM or SIGINT sets ``stop`` (an
    Event the serving threads also watch; a new one when None)."""
    stop = stop or threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(ready, flush=True)  # the lab waits for this line
    while not stop.wait(0.5):
        pass
