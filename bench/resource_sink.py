"""A plain RNS destination that accepts every Resource (for bench/sync.py).

Usage: python resource_sink.py CONFIGDIR CONNECT_HOSTPORT. Prints its
destination hash, then announces every second until killed."""

import sys

import RNS

from testbed import plain_destination


def main():
    destination = plain_destination.start(sys.argv[1], sys.argv[2], "rngridbench", "sink")
    destination.set_link_established_callback(lambda link: link.set_resource_strategy(RNS.Link.ACCEPT_ALL))
    plain_destination.announce_forever(destination, every_s=1)

if __name__ == "__main__":
    main()
