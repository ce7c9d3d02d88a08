"""Announces app_data of every given size, each on its own destination.

Usage: python announce_sizes.py CONFIGDIR CONNECT_HOSTPORT SIZE [SIZE ...]
Prints "SIZE HASH" lines, then re-announces every second until killed."""

import sys
import time

import RNS

from reticulum_grid.node import rnsnet


def main():
    configdir, connect, sizes = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]]
    rnsnet.write_config(configdir, connect=[connect])
    rnsnet.start(configdir)
    destinations = []
    for size in sizes:
        d = RNS.Destination(RNS.Identity(), RNS.Destination.IN, RNS.Destination.SINGLE, "rngridtest", "limit")
        destinations.append((size, d))
        print(size, d.hash.hex(), flush=True)
    time.sleep(1.0)
    while True:
        for size, d in destinations:
            d.announce(app_data=bytes([size % 251]) * size)
        time.sleep(1.0)


if __name__ == "__main__":
    main()
