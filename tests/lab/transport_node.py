"""An RNS transport node from an RNS config dir the lab wrote (``rngrid
transport`` writes its own TCP-only config; lab hops may be UDP). Runs with
the grid's rns 0.9.4 fixes until SIGTERM.

Run: ``python -m tests.lab.transport_node CONFIG_DIR``.
"""

import signal
import sys
import threading

from reticulum_grid.node import rnsnet


def main():
    rnsnet.start(sys.argv[1])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print("transport node up", flush=True)
    while not stop.wait(1.0):
        pass
    rnsnet.stop()


if __name__ == "__main__":
    main()
