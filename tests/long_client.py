"""A long-lived grid client in its own process (its own RNS instance), driven
over stdin for the field tests. Usage: python -m tests.long_client HOME HOST:PORT...

Prints {"ready": true} once started; then for each line read (a model alias)
runs one short inference and prints one JSON line: {"ok": true, "tower": NAME,
"s": seconds} or {"ok": false, "error": "code: message", "s": seconds}."""

import json
import sys
import time

from links.wire import WireError
from reticulum_grid.client import Grid


def main():
    home, connect = sys.argv[1], sys.argv[2:]
    grid = Grid(home=home, connect=connect)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        started = time.monotonic()
        try:
            pieces = list(grid.execute("ai/inference", {"model": line.strip(), "prompt": "Hi", "max_tokens": 4,
                                                        "temperature": 0.0}))
            result = {"ok": True, "tower": pieces[-1].tower}
        except WireError as e:
            result = {"ok": False, "error": f"{e.code}: {e.message}"}
        print(json.dumps({**result, "s": round(time.monotonic() - started, 2)}), flush=True)


if __name__ == "__main__":
    main()
