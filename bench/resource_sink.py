"""A plain RNS destination that accepts every Resource (for bench/sync.py).

Usage: python resource_sink.py CONFIGDIR CONNECT_HOSTPORT. Prints its
destination hash, then announces every second until killed."""

import sys
import time

import RNS

from reticulum_grid.node import rnsnet


def main():
    configdir, connect = sys.argv[1], sys.argv[2]
    rnsnet.write_config(configdir, connect=[connect])
    rnsnet.start(configdir)
    destination = RNS.Destination(RNS.Identity(), RNS.Destination.IN, RNS.Destination.SINGLE, "rngridbench", "sink")
    destination.set_link_established_callback(lambda link: link.set_resource_strategy(RNS.Link.ACCEPT_ALL))
    print(destination.hash.hex(), flush=True)
    while True:
        destination.announce()
        time.sleep(1)


if __name__ == "__main__":
    main()
