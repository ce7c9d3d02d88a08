"""Routing and load balancing: decision time, discovery time, and throughput
of 8 concurrent clients over two towers vs one.

- ``route_ms``: median time of one whole routing decision as a client makes
  it (``Grid.rank``: candidates from the table, live load older than 1 s
  refreshed over the Links it keeps with ``caps/full``, then the ranking),
  over two real towers on loopback, live load stale before every sample.
  ``rank_1000_ms`` is the ranking alone over 1,000 synthetic tower entries.
- ``discover_direct_s`` / ``discover_transport_s``: from a tower sending an
  announce (the time in its log, 1 ms resolution) to the client's RNS handing
  it over (perf counter), median of several re-announces each (the client
  pings, the tower answers), directly and through an RNS transport node. The
  first start-up (process spawn -> routable) is printed too.
- ``two_towers_vs_one``: 8 client threads, 3 requests each, every output
  exactly 64 tokens (temperature 0, a prompt that does not end), over two
  towers vs one; completion tokens per second of wall time.
"""

import argparse
import os
import re
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import RNS

from announce import caps as c
from announce.table import TowerEntry
from bench.common import run_at_once
from reticulum_grid.client import Grid, router
from reticulum_grid.client.grid import LIVE_MAX_AGE_S
from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.node.localgrid import TowerProcess, TransportProcess, free_port, trust_local_towers
from testbed.arrivals import Arrivals

ANNOUNCED = re.compile(r"^(\S+ \S+) rngrid.announce INFO announced \((.*?)\)", re.M)
#: Re-announces timed per discovery figure.
DISCOVERY_SAMPLES = 6
PROMPT = "{k}. Count from {k} to 5000, separated by commas: {k},"


def spread(values, unit=""):
    return f"median {statistics.median(values):.4g}{unit} (range {min(values):.4g}-{max(values):.4g}, n={len(values)})"


def rank_1000_ms(runs=200):
    """The ranking alone (router.choose) over 1,000 synthetic entries: ms per decision."""
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
    return [t * 1000 for t in times]


def route_ms(grid, model, runs=20):
    """Whole client decisions (Grid.rank) with the live load stale each time: ms each."""
    grid.rank(model)  # Links up, as a client that has routed before keeps them
    times = []
    for _ in range(runs):
        time.sleep(LIVE_MAX_AGE_S + 0.05)  # the live load is now stale: this decision refreshes it
        started = time.perf_counter()
        grid.rank(model)
        times.append(time.perf_counter() - started)
    return [t * 1000 for t in times]


def announce_times(tower):
    return [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for m in ANNOUNCED.finditer(tower.log())]


def discover(grid, arrivals, tmp, name, connect):
    """([seconds from a tower's announce to this client, per re-announce], spawn -> routable s)."""
    tower = TowerProcess(tmp, name, {f"{name}-model": default_model_path()},
                         allow={grid.identity_hash: ["infer"]}, connect=connect)
    spawned = time.perf_counter()
    tower.start()
    try:
        entry = grid.wait_for(lambda _: (e := grid.table.find(name)) and e.caps.model(f"{name}-model") and e, 120)
        if not entry:
            raise RuntimeError(f"{name} never became routable")
        start_up = time.perf_counter() - spawned
        samples = []
        for _ in range(DISCOVERY_SAMPLES):
            time.sleep(1.2)  # past the tower's floor_s (1 s), so the ping is answered at once
            sent, heard = len(announce_times(tower)), len(arrivals.times.get(entry.destination_hash, []))
            grid.ping(force=True)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (len(announce_times(tower)) <= sent or len(
                    arrivals.times.get(entry.destination_hash, [])) <= heard):
                time.sleep(0.05)
            announced = announce_times(tower)[sent:]
            arrived = arrivals.times.get(entry.destination_hash, [])[heard:]
            if announced and arrived:
                samples.append(arrived[0] - announced[0])
        if len(samples) < DISCOVERY_SAMPLES // 2:
            raise RuntimeError(f"{name}: only {len(samples)} of {DISCOVERY_SAMPLES} re-announces were timed")
    finally:
        tower.stop()
    return samples, start_up


def throughput(grid, towers, clients=8, requests=3, tokens=64):
    """Completion tokens per second for ``clients`` threads over ``towers``;
    every output must be exactly ``tokens`` long."""
    counts, errors = [], []

    def client(k):
        for i in range(requests):
            try:
                pieces = list(grid.execute("ai/inference", {"model": "lb-model", "max_tokens": tokens,
                                                            "temperature": 0.0,
                                                            "prompt": PROMPT.format(k=100 + 10 * k + i)}))
                counts.append(pieces[-1].completion_tokens)
            except Exception as e:  # reported, never hidden
                errors.append(repr(e))

    for entry in towers:
        grid.health.succeeded(entry.destination_hash)
    started = time.perf_counter()
    run_at_once(client, range(clients))
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[:3]}")
    if set(counts) != {tokens}:
        raise RuntimeError(f"outputs were not all {tokens} tokens long: {sorted(counts)}")
    return sum(counts) / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    ranking = rank_1000_ms()
    print(f"ranking alone over 1000 towers: {spread(ranking, ' ms')}")
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-route-") as tmp:
        tmp = Path(tmp)
        home = tmp / "client"
        identity.load_or_create(home / "identity")
        trust_local_towers(home)  # this client trusts the towers it starts
        address = f"127.0.0.1:{free_port()}"
        grid = Grid(home=home, rns_config=rnsnet.write_config(home / "rns-bench", listen=address))
        arrivals = Arrivals(clock=time.time)  # compared with the towers' log times
        RNS.Transport.register_announce_handler(arrivals)
        transport = TransportProcess(tmp, "bench-transport", connect=[address]).start()
        towers = []
        try:
            direct, direct_spawn = discover(grid, arrivals, tmp, "disc-direct", [address])
            via, via_spawn = discover(grid, arrivals, tmp, "disc-transport", [transport.address])
            print(f"discovery direct: {spread(direct, ' s')} from announce ({direct_spawn:.1f} s spawn -> routable)")
            print(f"discovery via transport node: {spread(via, ' s')} from announce "
                  f"({via_spawn:.1f} s spawn -> routable)")
            for name in ("lb-1", "lb-2"):
                tower = TowerProcess(tmp, name, {"lb-model": default_model_path()},
                                     allow={grid.identity_hash: ["infer"]}, connect=[address], limits={"queue_depth": 8})
                towers.append(tower.start())
            for name in ("disc-direct", "disc-transport"):  # stopped: out of the table
                if (gone := grid.table.find(name)) is not None:
                    grid.table.remove(gone.destination_hash)
            # Bounded by the towers' start-up (model load), not by a quiet table.
            entries = [grid.wait_for(lambda _, n=t.name: grid.table.find(n), 180) for t in towers]
            if not all(entries):
                raise RuntimeError("the load-balance towers were not heard within 180 s")
            decisions = route_ms(grid, "lb-model")
            print(f"whole routing decision, 2 towers, live load refreshed: {spread(decisions, ' ms')}")
            both = throughput(grid, entries)
            towers[1].stop()
            grid.table.remove(entries[1].destination_hash)
            one = throughput(grid, entries[:1])
            print(f"8 clients x 3 requests x 64 tokens: two towers {both:.1f} tokens/s, one tower {one:.1f} tokens/s")
            print(f"rank_1000_ms={statistics.median(ranking):.3f}")
            print(f"route_ms={statistics.median(decisions):.3f}")
            print(f"discover_direct_s={statistics.median(direct):.4f}")
            print(f"discover_transport_s={statistics.median(via):.4f}")
            print(f"two_towers_vs_one={both / one:.2f}")
        finally:
            RNS.Transport.deregister_announce_handler(arrivals)
            grid.close()
            rnsnet.stop()
            for tower in towers:
                tower.stop()
            transport.stop()


if __name__ == "__main__":
    main()
