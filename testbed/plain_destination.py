"""A plain RNS destination in a process of its own, for tests and benches that
exercise RNS itself rather than a tower: its config written first (never RNS's
default), its hash printed for the parent, announced until the process is killed."""

import time

import RNS

from reticulum_grid.node import rnsnet


def start(configdir, connect, app, *aspects):
    """RNS started from a new config in ``configdir`` that connects to ``connect``
    (host:port), and an IN destination ``app.aspects`` of a fresh identity."""
    rnsnet.write_config(configdir, connect=[connect])
    rnsnet.start(configdir)
    return RNS.Destination(RNS.Identity(), RNS.Destination.IN, RNS.Destination.SINGLE, app, *aspects)


def announce_forever(destination, every_s):
    """Print ``destination``'s hash (hex, one line), then announce it every ``every_s`` seconds."""
    print(destination.hash.hex(), flush=True)
    while True:
        destination.announce()
        time.sleep(every_s)
