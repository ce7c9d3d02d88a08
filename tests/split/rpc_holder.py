"""A coordinator that takes a worker tower's RPC server and keeps it: a grid
client process (its own RNS instance and identity) that asks the worker for
``shard/tunnel``, opens one tunnel, says llama.cpp's HELLO through it, prints
``{"held": true}`` once the server answered, and then holds the connection until
it is killed (as a coordinator whose tower died with its Link up): without a
word, or with ``--active`` asking the server's device count every 0.5 s (a
plan in use).
Usage: python rpc_holder.py [--active] HOME HOST:PORT WORKER_NAME"""

import json
import os
import socket
import struct
import sys
import time

from links.wire import Code, WireError
from reticulum_grid.client import Grid
from reticulum_grid.split.rpcworker import hello
from reticulum_grid.split.tunnel import TunnelListener, Tunnels

#: ggml-rpc's RPC_CMD_DEVICE_COUNT (15) with no input; its reply: u64 size 4, u32 count (ggml/src/ggml-rpc).
DEVICE_COUNT = bytes([15]) + struct.pack("<Q", 0)
DEVICE_COUNT_REPLY_BYTES = 12


def use(sock):
    while True:
        sock.sendall(DEVICE_COUNT)
        got = b""
        while len(got) < DEVICE_COUNT_REPLY_BYTES:
            part = sock.recv(DEVICE_COUNT_REPLY_BYTES - len(got))
            if not part:
                return
            got += part
        time.sleep(0.5)


def main():
    args = sys.argv[1:]
    active = args[0] == "--active"
    home, address, worker = args[1:4] if active else args[:3]
    grid = Grid(home=home, connect=[address])
    entry = grid.wait_for(lambda _: grid.table.find(worker), 60)
    conn = grid.connection(entry)
    for _ in range(60):  # bounded: a plan in use keeps the server, an idle one gives it up after yield_idle_s
        try:
            conn.request("shard/tunnel", {}, timeout=30)
            break
        except WireError as e:
            if e.code != Code.BUSY:
                raise
            time.sleep(1.0)
    listener = TunnelListener(Tunnels(conn.router), lambda: [os.getpid()])
    host, port = listener.endpoint.split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    print(json.dumps({"held": hello(sock)}), flush=True)
    if active:
        use(sock)
    while True:  # hold it: no bytes, no close
        time.sleep(60)


if __name__ == "__main__":
    main()
