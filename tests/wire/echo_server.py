"""A plain RNS destination with echo handlers, for the race-fix tests.

Usage: python -m tests.wire.echo_server CONFIGDIR CONNECT_HOSTPORT. Prints its destination
hash on stdout, then serves until killed. Requests "echo" and "big" answer
with the request data (x1, x32768); Channel messages of type Echo come back;
its Links carry tunnels (split/tunnel.py) to a TCP echo server in this process.

``spawn(directory, hub_address)`` starts it for a test: (process, destination hash)."""

import socket
import subprocess
import sys
import threading
from pathlib import Path

import RNS

from links.channel import ChannelRouter
from reticulum_grid.split.tunnel import Tunnels
from testbed import plain_destination

ROOT = Path(__file__).resolve().parents[2]


class Echo(RNS.MessageBase):
    MSGTYPE = 0x7E01

    def __init__(self, data=b""):
        self.data = data

    def pack(self):
        return self.data

    def unpack(self, raw):
        self.data = raw


def spawn(directory, hub_address):
    """This script in its own process, connected to ``hub_address``: (its Popen, its destination hash)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.wire.echo_server", str(directory), hub_address],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    return proc, bytes.fromhex(proc.stdout.readline().strip())


def tcp_echo():
    """A TCP server on 127.0.0.1 sending back what each connection sends; its port."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept():
        while True:
            threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server.getsockname()[1]


def echo_channel(link, tcp_port):
    router = ChannelRouter(link)
    router.on(Echo, lambda message: threading.Thread(target=router.send, args=(Echo(message.data),)).start())
    Tunnels(router, target=lambda: socket.create_connection(("127.0.0.1", tcp_port), timeout=10))


def main():
    destination = plain_destination.start(sys.argv[1], sys.argv[2], "rngridtest", "echo")
    destination.register_request_handler("echo", response_generator=lambda p, d, rid, ident, at: d,
                                         allow=RNS.Destination.ALLOW_ALL)
    destination.register_request_handler("big", response_generator=lambda p, d, rid, ident, at: d * 32768,
                                         allow=RNS.Destination.ALLOW_ALL)
    tcp_port = tcp_echo()
    destination.set_link_established_callback(lambda link: echo_channel(link, tcp_port))
    plain_destination.announce_forever(destination, every_s=2)


if __name__ == "__main__":
    main()
