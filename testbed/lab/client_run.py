"""One client session inside the lab's client namespace, measured: discovery
time, then inferences with TTFT, the time of the last text, the tower's own
figures and the wire bytes each put on the hops (from the relays' counters).
Prints one JSON object.

Run: ``python -m testbed.lab.client_run --home H --rns-config D --stats HOP0.json ...``.
"""

import argparse
import json
import logging
import os
import time

from reticulum_grid.client import Grid, Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS

#: Seconds the relays' counters may lag (they write every 0.1 s) plus the last
#: delivery proofs still in flight after a stream ends.
SETTLE_S = 1.5


def wire_bytes(paths, unit="bytes"):
    """Bytes (or packets) each hop carried so far, both directions (a list, one per hop)."""
    totals = []
    for path in paths:
        with open(path) as f:
            counts = json.load(f)
        totals.append(counts[f"{unit}_ab"] + counts[f"{unit}_ba"])
    return totals


def client_parser(discover_timeout):
    """The options of every client run in the lab: its home, RNS config, the
    relays' counters, the tower it asks and how long it waits to hear it (s)."""
    p = argparse.ArgumentParser()
    p.add_argument("--home", required=True)
    p.add_argument("--rns-config", required=True)
    p.add_argument("--stats", action="append", default=[], help="relay counters of each hop")
    p.add_argument("--tower", default="lab-tower")
    p.add_argument("--discover-timeout", type=float, default=discover_timeout)
    return p


def main():
    p = client_parser(discover_timeout=120.0)
    p.add_argument("--prompt", default="Name three colours.")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--pull", help="then pull this blob from the tower, timed")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if os.environ.get("LAB_RNS_DEBUG"):
        logging.getLogger("rngrid.rns").setLevel(logging.DEBUG)
    started = time.monotonic()
    grid = Grid(home=a.home, rns_config=a.rns_config)
    result = {"runs": []}
    try:
        entry = grid.wait_for(lambda _: grid.table.find(a.tower), a.discover_timeout)
        result["discovery_s"] = round(time.monotonic() - started, 3)
        if not entry:
            result["error"] = f"{a.tower} not heard within {a.discover_timeout:.0f} s"
            return result
        result["hops"] = entry.hops
        for _ in range(a.runs):
            result["runs"].append(infer(grid, a))
        if a.pull:
            result["pull"] = pull(grid, a)
    finally:
        print(json.dumps(result), flush=True)
        grid.close()


def infer(grid, a):
    before, packets = wire_bytes(a.stats), wire_bytes(a.stats, "packets")
    start = time.monotonic()
    stream = grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "messages": [{"role": "user", "content": a.prompt}],
                                           "max_tokens": a.max_tokens, "temperature": 0.0}, tower=a.tower)
    pieces, first, last = [], None, None
    for piece in stream:
        if isinstance(piece, Usage):
            usage = piece
        else:
            last = time.monotonic()
            first = first or last
            pieces.append(piece)
    elapsed = time.monotonic() - start
    time.sleep(SETTLE_S)
    return {"text": "".join(pieces), "elapsed_s": round(elapsed, 3),
            "ttft_s": round((first or time.monotonic()) - start, 3),
            "last_s": round((last or time.monotonic()) - start, 3), "completion_tokens": usage.completion_tokens,
            # the tower's own figures: its prompt time to the first token, and its generation rate
            "tower_ttft_s": usage.tower_ttft_s, "tower_tokens_per_s": usage.tokens_per_s,
            "prompt_tokens": usage.prompt_tokens, "wire_bytes": [x - b for x, b in zip(wire_bytes(a.stats), before)],
            "wire_packets": [x - b for x, b in zip(wire_bytes(a.stats, "packets"), packets)]}




def pull(grid, a):
    before = wire_bytes(a.stats)
    start = time.monotonic()
    info, report = grid.pull(a.pull, from_tower=a.tower, alias=f"{a.pull}-copy", max_seconds=None)
    elapsed = time.monotonic() - start
    time.sleep(SETTLE_S)
    return {"bytes": info.size, "elapsed_s": round(elapsed, 3), "mb_per_s": round(info.size / elapsed / 1e6, 4),
            "wire_bytes": [after - b for after, b in zip(wire_bytes(a.stats), before)]}


if __name__ == "__main__":
    main()
