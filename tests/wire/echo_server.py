"""A plain RNS destination with echo handlers, for the race-fix tests.

Usage: python -m tests.wire.echo_server CONFIGDIR CONNECT_HOSTPORT. Prints its destination
hash on stdout, then serves until killed. Requests "echo" and "big" answer
with the request data (x1, x32768); Channel messages of type Echo come back."""

import sys
import threading

import RNS

from links.channel import ChannelRouter
from testbed import plain_destination


class Echo(RNS.MessageBase):
    MSGTYPE = 0x7E01

    def __init__(self, data=b""):
        self.data = data

    def pack(self):
        return self.data

    def unpack(self, raw):
        self.data = raw


def echo_channel(link):
    router = ChannelRouter(link)
    router.on(Echo, lambda message: threading.Thread(target=router.send, args=(Echo(message.data),)).start())


def main():
    destination = plain_destination.start(sys.argv[1], sys.argv[2], "rngridtest", "echo")
    destination.register_request_handler("echo", response_generator=lambda p, d, rid, ident, at: d,
                                         allow=RNS.Destination.ALLOW_ALL)
    destination.register_request_handler("big", response_generator=lambda p, d, rid, ident, at: d * 32768,
                                         allow=RNS.Destination.ALLOW_ALL)
    destination.set_link_established_callback(echo_channel)
    plain_destination.announce_forever(destination, every_s=2)

if __name__ == "__main__":
    main()
