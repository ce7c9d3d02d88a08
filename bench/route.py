"""Routing and load balancing: decision time, discovery time, and throughput
of 8 concurrent clients over two towers vs one.

- ``route_ms``: median time of one routing decision (router.choose) over
  1,000 synthetic tower entries (half have the model loaded, loads vary).
- ``discover_direct_s`` / ``discover_transport_s``: from a tower being up (its
  destination announced, as its log says) to the client routing to it, with
  the tower connected to the client directly and through an RNS transport
  node. The time from spawning the tower process (imports, model load) is
  printed too.
- ``two_towers_vs_one``: 8 client threads, 3 requests each (64 tokens), over
  two towers vs one; completion tokens per second of wall time.
"""

import argparse
import os
import re
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from announce import caps as c
from announce.table import TowerEntry
from reticulum_grid import identity, rnsnet, router
from reticulum_grid.client import Grid
from reticulum_grid.default_model import default_model_path
from reticulum_grid.localgrid import TowerProcess, TransportProcess, free_port

ANNOUNCED = re.compile(r"^(\S+ \S+) rngrid.announce INFO announced \(start\)", re.M)


def route_ms(runs=200):
    entries = []
    for i in range(1000):
        caps = c.Caps(name=f"t{i}", hardware=c.Hardware("cuda", "gpu", 24000, (i * 37) % 24000, 64000, 30000),
                      models=(c.ModelCap("other", b"abcd", True), c.ModelCap("coder-32b", b"wxyz", i % 2 == 0)),
                      load=c.Load(i % 4, i % 7 == 0, i % 3), tokens_per_s=20 + i % 50)
        entries.append(TowerEntry(os.urandom(16), caps, 1 + i % 4, 0.0))
    health = router.HealthBook()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        router.choose(entries, "coder-32b", health=health, need_mib=20000)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def discover(grid, tmp, name, connect):
    """(seconds from 'announced (start)' to routable, seconds from spawn to routable)."""
    tower = TowerProcess(tmp, name, {f"{name}-model": default_model_path()},
                         allow={grid.identity_hash: ["infer"]}, connect=connect)
    spawned = time.time()
    tower.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            entry = grid.table.find(name)
            if entry is not None and entry.caps.model(f"{name}-model"):
                routable = time.time()
                break
            time.sleep(0.005)
        else:
            raise RuntimeError(f"{name} never became routable")
        deadline = time.monotonic() + 10
        while not ANNOUNCED.search(tower.log()) and time.monotonic() < deadline:
            time.sleep(0.05)  # the tower logs its announce just after sending it
        announced = datetime.strptime(ANNOUNCED.search(tower.log()).group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    finally:
        tower.stop()
    return routable - announced, routable - spawned


def throughput(grid, towers, clients=8, requests=3, tokens=64):
    """Completion tokens per second for ``clients`` threads over ``towers``."""
    counts, errors = [], []

    def client(k):
        for i in range(requests):
            try:
                pieces = list(grid.execute("ai/inference", {"model": "lb-model", "max_tokens": tokens,
                                                            "temperature": 0.7, "prompt": f"Story {k}-{i}: Once"}))
                counts.append(pieces[-1].completion_tokens)
            except Exception as e:  # reported, never hidden
                errors.append(repr(e))

    for entry in towers:
        grid.health.succeeded(entry.destination_hash)
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[:3]}")
    return sum(counts) / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    print(f"route decision over 1000 towers: {route_ms():.3f} ms (median)")
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-route-") as tmp:
        tmp = Path(tmp)
        home = tmp / "client"
        identity.load_or_create(home / "identity")
        address = f"127.0.0.1:{free_port()}"
        grid = Grid(home=home, rns_config=rnsnet.write_config(home / "rns-bench", listen=address))
        transport = TransportProcess(tmp, "bench-transport", connect=[address]).start()
        towers = []
        try:
            direct, direct_spawn = discover(grid, tmp, "disc-direct", [address])
            via, via_spawn = discover(grid, tmp, "disc-transport", [transport.address])
            print(f"discovery direct: {direct:.3f} s from announce ({direct_spawn:.1f} s from process spawn)")
            print(f"discovery via transport node: {via:.3f} s from announce ({via_spawn:.1f} s from process spawn)")
            for name in ("lb-1", "lb-2"):
                tower = TowerProcess(tmp, name, {"lb-model": default_model_path()},
                                     allow={grid.identity_hash: ["infer"]}, connect=[address], limits={"queue_depth": 8})
                towers.append(tower.start())
            entries = [grid.find_tower(t.name, timeout=60) for t in towers]
            both = throughput(grid, entries)
            towers[1].stop()
            grid.table.remove(entries[1].destination_hash)
            one = throughput(grid, entries[:1])
            print(f"8 clients x 3 requests: two towers {both:.1f} tokens/s, one tower {one:.1f} tokens/s")
            print(f"route_ms={route_ms():.3f}")
            print(f"discover_direct_s={direct:.3f}")
            print(f"discover_transport_s={via:.3f}")
            print(f"two_towers_vs_one={both / one:.2f}")
        finally:
            grid.close()
            rnsnet.stop()
            for tower in towers:
                tower.stop()
            transport.stop()


if __name__ == "__main__":
    main()
