"""One grid client process for the load tests: REQUESTS inferences one after
another, a JSON line per result. Usage: python load_client.py HOME REQUESTS HOST:PORT..."""

import json
import sys

from links.wire import WireError
from reticulum_grid.client import Grid
from reticulum_grid.inference.default_model import DEFAULT_ALIAS


def main():
    home, count, connect = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    grid = Grid(home=home, connect=connect)
    grid.wait_for(lambda entries: len(entries) >= len(connect), 60)
    for i in range(count):
        try:
            pieces = list(grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "max_tokens": 24,
                                                        "prompt": f"Request {i}: list three colours:"}))
            usage = pieces[-1]
            print(json.dumps({"ok": True, "tower": usage.tower, "tokens": usage.completion_tokens}), flush=True)
        except WireError as e:
            print(json.dumps({"ok": False, "code": e.code, "message": e.message}), flush=True)


if __name__ == "__main__":
    main()
