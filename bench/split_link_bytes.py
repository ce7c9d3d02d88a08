"""Bytes a split model's worker link carries per generated token, measured
against what the estimator counts (split/estimate.py link_bytes_per_token).

llama.cpp alone, as a coordinator runs it (split/supervisor.py's SplitModel,
one slot), over one ggml-rpc-server (split/rpcworker.py) holding half of the
layers, every RPC byte through a relay on 127.0.0.1 that counts both ways.
The relay splits the coordinator-to-worker bytes into ggml-rpc.cpp's
messages as they pass (a command byte, a 64-bit length, the payload; a
tensor's name sits at byte 232 of its 304-byte rpc_tensor). One stream at
temperature 0; a token is counted from one graph_recompute to the next once
llama.cpp reuses its decode graph (it sends a graph whole for the prompt and
for the first few tokens, ``whole_graphs`` in all, the last one of
``decode_graph_bytes``), and one token's messages are printed one a line.

Prints ``bytes_per_token=`` (both ways; ``up_bytes_per_token=`` towards the
worker), ``estimated_bytes_per_token=`` and ``measured_vs_estimate=``.

Run: ``.venv/bin/python bench/split_link_bytes.py [--model GGUF] [--max-tokens 96]``.
"""

import argparse
import socket
import struct
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reticulum_grid.inference import generation, request as inference_request  # noqa: E402
from reticulum_grid.inference.default_model import default_model_path  # noqa: E402
from reticulum_grid.split import estimate  # noqa: E402
from reticulum_grid.split.rpcworker import RpcWorker  # noqa: E402
from reticulum_grid.split.supervisor import SplitModel  # noqa: E402
from reticulum_grid.store import gguf_info  # noqa: E402

PROMPT = "Count from 1 to 5000, separated by commas: 1,"


#: ggml-rpc.cpp's rpc_cmd values, in order.
COMMANDS = ("alloc_buffer", "get_alignment", "get_max_size", "buffer_get_base", "free_buffer", "buffer_clear",
            "set_tensor", "set_tensor_hash", "get_tensor", "copy_tensor", "graph_compute", "get_device_memory",
            "init_tensor", "get_alloc_size", "hello", "device_count", "graph_recompute", "memset_tensor")


@dataclass
class Message:
    """One RPC message towards the worker: its bytes, command, tensor name
    (set_tensor, get_tensor) and both byte counters once it had passed."""
    size: int
    command: str
    tensor: str
    up: int
    down: int

    def line(self) -> str:
        return f"{self.size} bytes: {self.command} {self.tensor}".rstrip()


class CountingRelay:
    """Listens on 127.0.0.1 and relays each connection to ``target``
    (host:port), counting the bytes each way and keeping the messages towards
    the target (``messages``: Message, in order)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.up, self.down = 0, 0
        self.messages: list[Message] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    def endpoint(self) -> str:
        return f"127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        host, port = self.target.rsplit(":", 1)
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            peer = socket.create_connection((host, int(port)))
            for sock in (conn, peer):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._relay, args=(conn, peer, True), daemon=True).start()
            threading.Thread(target=self._relay, args=(peer, conn, False), daemon=True).start()

    def _relay(self, a: socket.socket, b: socket.socket, up: bool) -> None:
        head, body, left = bytearray(), bytearray(), -1  # left: payload bytes to come; -1: in a header
        try:
            while data := a.recv(1 << 16):
                i = 0
                while up and i < len(data):
                    if left < 0:
                        take = data[i:i + 9 - len(head)]
                        head += take
                        if len(head) == 9:
                            left, body = struct.unpack_from("<Q", head, 1)[0], bytearray()
                    else:
                        take = data[i:i + left]
                        body += take[:max(0, 296 - len(body))]
                        left -= len(take)
                    i += len(take)
                    if left == 0:
                        self._message(bytes(head), bytes(body), self.up + i)
                        head, left = bytearray(), -1
                if up:
                    self.up += len(data)
                else:
                    self.down += len(data)
                b.sendall(data)
        except OSError:
            pass
        for sock in (a, b):  # the RPC server serves one connection at a time: end both halves
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _message(self, head: bytes, body: bytes, up: int) -> None:
        command = COMMANDS[head[0]] if head[0] < len(COMMANDS) else f"command {head[0]}"
        tensor = body[232:296].split(b"\0")[0].decode("utf-8", "replace") if command.endswith("_tensor") else ""
        self.messages.append(Message(9 + struct.unpack_from("<Q", head, 1)[0], command, tensor, up, self.down))

    def close(self) -> None:
        self.listener.close()


def measure(model: Path, max_tokens: int, root: Path) -> tuple[dict[str, float], list[str]]:
    """(figures, one token's messages towards the worker, one a line) of one
    stream of ``max_tokens``; a token counts from one graph_recompute to the next after the last whole graph."""
    facts = gguf_info.facts(model)
    worker = RpcWorker(root / "rpc.log", threads=1, private=False)
    relay = CountingRelay(worker.endpoint())
    split = None
    try:
        half = facts.blocks // 2
        split = SplitModel("bytes", model, 4096, [relay.endpoint()], [half, facts.blocks - half], root / "split.log",
                           threads=1).start(timeout=300)
        request = inference_request.parse({"model": "m", "prompt": PROMPT, "max_tokens": max_tokens,
                                           "temperature": 0.0, "stream_id": 0})
        result = generation.Generation()
        for _ in split.generate(request, threading.Event(), result):
            pass
    finally:
        if split is not None:
            split.close()
        relay.close()
        worker.stop()
    sent = relay.messages
    graphs = [i for i, m in enumerate(sent) if m.command == "graph_compute"]
    steps = [i for i, m in enumerate(sent) if m.command == "graph_recompute" and i > graphs[-1]]
    if len(steps) < 2:
        raise SystemExit(f"llama.cpp reused its last graph {len(steps)} times: no token to count")
    first, last, tokens = sent[steps[0]], sent[steps[-1]], len(steps) - 1
    per_token = (last.up - first.up + last.down - first.down) / tokens
    estimated = estimate.link_bytes_per_token(facts.embedding, result.prompt_tokens + result.completion_tokens)
    return {"tokens": tokens, "embedding": facts.embedding, "whole_graphs": len(graphs),
            "decode_graph_bytes": sent[graphs[-1]].size,
            "up_bytes_per_token": round((last.up - first.up) / tokens), "bytes_per_token": round(per_token),
            "estimated_bytes_per_token": estimated, "measured_vs_estimate": round(per_token / estimated, 3),
            }, [m.line() for m in sent[steps[0] + 1:steps[1] + 1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: the bundled model)")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures, one_token = measure(args.model or Path(default_model_path()), args.max_tokens, Path(tmp))
    for line in one_token:
        print("  " + line)
    for key, value in figures.items():
        print(f"{key}={value}")


if __name__ == "__main__":
    main()
