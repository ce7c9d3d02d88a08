"""A plain RNS destination with echo handlers, for the race-fix tests.

Usage: python echo_server.py CONFIGDIR CONNECT_HOSTPORT. Prints its destination
hash on stdout, then serves until killed."""

import sys
import time

import RNS

from reticulum_grid import rnsnet


def main():
    configdir, connect = sys.argv[1], sys.argv[2]
    rnsnet.write_config(configdir, connect=[connect])
    rnsnet.start(configdir)
    identity = RNS.Identity()
    destination = RNS.Destination(identity, RNS.Destination.IN, RNS.Destination.SINGLE, "rngridtest", "echo")
    destination.register_request_handler("echo", response_generator=lambda p, d, rid, ident, at: d,
                                         allow=RNS.Destination.ALLOW_ALL)
    destination.register_request_handler("big", response_generator=lambda p, d, rid, ident, at: d * 32768,
                                         allow=RNS.Destination.ALLOW_ALL)
    print(destination.hash.hex(), flush=True)
    while True:
        destination.announce()
        time.sleep(2)


if __name__ == "__main__":
    main()
