"""One grid client in its own process (its own RNS instance), for the tests that
need a client apart from the test process: several clients at once, a client
behind a transport node, a split client. ``ClientProcess`` drives it.

The process (``python -m tests.client_process HOME HOST:PORT...``) reads one
JSON request per line on stdin, ``{"payload": {...}, "wait_towers": N, "wait_names": [name, ...]}`` (an
``ai/inference`` payload; it first waits up to 60 s until it has heard N towers, default 1, those named among
them: a tower that left stays in the table until its entry expires, so a count cannot tell one that joined),
and writes JSON
lines: ``{"plan": [tower, ...], "strategy": its strategy}`` when the request is split, ``{"text": piece}``
per text piece, ``{"tool_call": {index, id, name, arguments}}`` per tool-call
piece, then ``{"usage": {...}, "plan": ...}`` or ``{"error": {"code",
"message"}}``, then ``{"done": true, "s": seconds since the request was read}``."""

import dataclasses
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Reply(NamedTuple):
    """One request's outcome as the client process saw it; ``seconds`` from reading it to its end."""
    text: str
    usage: dict | None
    error: dict | None
    plan: list | None
    seconds: float


class ClientProcess:
    """This module's client in a process of its own, started at once."""

    def __init__(self, home, connect):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.client_process", str(home), *connect], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def ask(self, payload, wait_towers=1, wait_names=()):
        """Send one request; its lines come back through ``result``."""
        self.proc.stdin.write(json.dumps({"payload": payload, "wait_towers": wait_towers,
                                          "wait_names": list(wait_names)}) + "\n")
        self.proc.stdin.flush()

    def next(self, timeout=180):
        item = self.lines.get(timeout=timeout)
        assert item is not None, "the client process ended"
        return item

    def result(self, timeout=180):
        """The Reply of the oldest request not read yet."""
        text, usage, error, plan = "", None, None, None
        while not (item := self.next(timeout)).get("done"):
            text += item.get("text", "")
            usage, error = item.get("usage", usage), item.get("error", error)
            plan = item.get("plan") or plan
        return Reply(text, usage, error, plan, item["s"])

    def close(self):
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _say(obj):
    print(json.dumps(obj), flush=True)


def _serve(grid, request):
    from links.wire import WireError
    from reticulum_grid.client import ToolCallDelta, Usage

    names = set(request.get("wait_names", ()))
    grid.wait_for(lambda entries: len(entries) >= request.get("wait_towers", 1)
                  and names <= {e.name for e in entries}, 60)
    try:
        stream = grid.execute("ai/inference", request["payload"])
        plan = getattr(stream, "plan", None)
        if plan is not None:
            _say({"plan": plan.towers, "strategy": plan.strategy})
        for piece in stream:
            if isinstance(piece, Usage):
                plan = getattr(stream, "plan", None)
                _say({"usage": piece.__dict__, "plan": plan and plan.towers})
            elif isinstance(piece, ToolCallDelta):
                _say({"tool_call": dataclasses.asdict(piece)})
            else:
                _say({"text": piece})
    except WireError as e:
        _say({"error": {"code": e.code, "message": e.message}})


def main():
    from reticulum_grid.client import Grid

    home, connect = sys.argv[1], sys.argv[2:]
    grid = Grid(home=home, connect=connect)
    for line in sys.stdin:
        started = time.monotonic()
        _serve(grid, json.loads(line))
        _say({"done": True, "s": round(time.monotonic() - started, 2)})


if __name__ == "__main__":
    main()
