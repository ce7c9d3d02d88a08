"""A grid client process for the split tests: reads one JSON request per
line on stdin ({"payload": {...}, "wait_towers": N}) and writes JSON lines:
{"plan": [tower, ...], "strategy": its strategy} when the request is split, {"text": piece} per
text piece, {"tool_call": {index, id, name, arguments}} per tool-call piece, then {"usage": {...}} or {"error": {"code", "message"}}, then {"done": true}.
Usage: python split_client.py HOME HOST:PORT..."""

import dataclasses
import json
import sys

from links.wire import WireError
from reticulum_grid.client import Grid, ToolCallDelta, Usage


def say(obj):
    print(json.dumps(obj), flush=True)


def main():
    home, connect = sys.argv[1], sys.argv[2:]
    grid = Grid(home=home, connect=connect)
    for line in sys.stdin:
        request = json.loads(line)
        grid.wait_for(lambda entries: len(entries) >= request.get("wait_towers", 1), 60)
        try:
            stream = grid.execute("ai/inference", request["payload"])
            if getattr(stream, "plan", None) is not None:
                say({"plan": stream.plan.towers, "strategy": stream.plan.strategy})
            for piece in stream:
                if isinstance(piece, Usage):
                    say({"usage": piece.__dict__, "plan": getattr(stream, "plan", None) and stream.plan.towers})
                elif isinstance(piece, ToolCallDelta):
                    say({"tool_call": dataclasses.asdict(piece)})
                else:
                    say({"text": piece})
        except WireError as e:
            say({"error": {"code": e.code, "message": e.message}})
        say({"done": True})


if __name__ == "__main__":
    main()
