"""Blob sync throughput: our chunk protocol vs RNS's own tools, and two sources vs one.

Part 1, one file over loopback TCP between two RNS instances:
- ours: `Grid.pull` from a tower (64 KiB Channel messages, 1 MiB verified chunks);
- rncp (RNS's copy tool), default settings and with -C (no compression), run
  with our rns 0.9.4 race fixes (without them it often fails to start). Each
  rncp send is a new process that starts RNS, finds a path and sets up a
  link before the first byte moves: that start-up is measured, as the median
  of several sends of a 1-byte file, printed, and subtracted from each big
  send (the rate without subtracting it is printed too);
- a plain RNS Resource of the open file (no compression) to a sink: the
  strongest baseline (what RNS itself gives a program on a kept Link), run in
  pairs with ours, alternating which goes first.
Part 2, each source's link shaped to the same bandwidth by a rate-limited TCP
proxy on 127.0.0.1: pull from two towers at once vs from one, alternating.

Every figure is the median of ``--runs`` runs, printed with its range.
Prints MB/s (10^6 bytes/s) for each; last lines
``sync_vs_resource=<ours / plain RNS Resource>`` (the median of the per-pair
ratios: the headline), ``sync_vs_rncp=<ours / best rncp>`` and
``two_sources_vs_one=<two / one>``. Goals (issue 3): >= 1.0 and >= 1.8.
"""

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import RNS

from reticulum_grid.node import identity, rnsnet
from reticulum_grid.store.blobstore import BlobStore
from reticulum_grid.client import Grid
from reticulum_grid.node.connection import open_link
from reticulum_grid.node.localgrid import TowerProcess, free_port, trust_local_towers, wait_port

HERE = Path(__file__).parent
MB = 1e6
# rncp as shipped with rns 0.9.4 often fails to start a transfer ("File was not
# accepted") because of the send-before-register races; run it on the same
# fixed stack as ours so the comparison is about the protocols.
RNCP = [sys.executable, "-c", "import sys; from links import rnsfix; rnsfix.apply(); "
        "from RNS.Utilities import rncp; sys.argv[0] = 'rncp'; rncp.main()"]


class RateLimitedProxy:
    """127.0.0.1:port -> target, pacing the target-to-client direction to
    ``rate`` bytes/s (token bucket, 16 KiB pieces). Stops with the process."""

    def __init__(self, target_port, rate):
        self.target_port, self.rate = target_port, rate
        self.port = free_port()
        self.server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            client, _ = self.server.accept()
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.rate), daemon=True).start()

    @staticmethod
    def _pump(src, dst, rate):
        next_at = time.monotonic()
        try:
            while data := src.recv(16384):
                if rate:
                    next_at = max(next_at, time.monotonic()) + len(data) / rate
                    time.sleep(max(0.0, next_at - time.monotonic()))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()


def spread(values, fmt=".1f"):
    return (f"{statistics.median(values):{fmt}} (range {min(values):{fmt}}-{max(values):{fmt}}, "
            f"n={len(values)})")


def timed_pull(grid, store_dir, name, from_tower=None):
    grid.store = BlobStore(store_dir)
    started = time.perf_counter()
    info, report = grid.pull(name, from_tower=from_tower)
    return info.size / (time.perf_counter() - started) / MB, report


def rncp_rates(tmp, path, flags, runs):
    """([MB/s with the start-up subtracted], [MB/s as timed], [start-up s]) over ``runs`` sends each."""
    listener_dir = rnsnet.write_config(tmp / f"rncp-l{flags}", listen=f"127.0.0.1:{(port := free_port())}")
    sender_dir = rnsnet.write_config(tmp / f"rncp-s{flags}", connect=[f"127.0.0.1:{port}"])
    save = tmp / f"rncp-save{flags}"
    save.mkdir()
    listener = subprocess.Popen(RNCP + ["--config", str(listener_dir), "-l", "-n", "-b", "0", "-s", str(save)]
                                + flags.split(), stdout=subprocess.PIPE, text=True)
    try:
        wait_port(port, 30)
        dest = next(line for line in listener.stdout if "listening on" in line).split("<")[1].split(">")[0]

        def send(file):
            started = time.perf_counter()
            result = subprocess.run(RNCP + ["--config", str(sender_dir), "-S", str(file), dest] + flags.split(),
                                    capture_output=True, text=True, timeout=600)
            if result.returncode != 0:
                raise RuntimeError(f"rncp failed: {result.stdout.strip()[-300:]}")
            for received in save.iterdir():
                received.unlink()
            return time.perf_counter() - started

        tiny = tmp / "tiny"
        tiny.write_bytes(b"x")
        start_up = [send(tiny) for _ in range(runs)]
        overhead = statistics.median(start_up)
        timed = [send(path) for _ in range(runs)]
        size = path.stat().st_size / MB
        return [size / (t - overhead) for t in timed], [size / t for t in timed], start_up
    finally:
        listener.kill()
        listener.wait()


@contextlib.contextmanager
def resource_sink(tmp, client_address):
    """A sink process on a kept Link; gives ``send(path)``: MB/s of one plain RNS
    Resource of the file over it."""
    # As a module from the repository root: a script's own folder would come first on its path.
    proc = subprocess.Popen([sys.executable, "-m", "bench.resource_sink", str(tmp / "sink"), client_address],
                            stdout=subprocess.PIPE, text=True, cwd=HERE.parent)
    try:
        link = open_link(bytes.fromhex(proc.stdout.readline().strip()), "rngridbench", "sink", timeout=30)

        def send(path):
            done = threading.Event()
            started = time.perf_counter()
            with open(path, "rb") as f:
                RNS.Resource(f, link, callback=lambda r: done.set(), auto_compress=False)
                if not done.wait(600):
                    raise RuntimeError("a Resource did not complete within 600 s")
            return path.stat().st_size / (time.perf_counter() - started) / MB

        yield send
        link.teardown()
    finally:
        proc.kill()
        proc.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--shaped-mib", type=int, default=32)
    parser.add_argument("--rate-mbps", type=float, default=8.0, help="per-source bandwidth in part 2 (MB/s)")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (medians are printed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-sync-") as tmp:
        tmp = Path(tmp)
        big = tmp / "big.bin"
        big.write_bytes(os.urandom(args.size_mib << 20))
        shaped = tmp / "shaped.bin"
        shaped.write_bytes(os.urandom(args.shaped_mib << 20))
        home = tmp / "bench-client"
        client_id = identity.load_or_create(home / "identity").hash.hex()
        trust_local_towers(home)  # this client trusts the towers it starts
        towers = []
        for name, blob in (("bench-direct", big), ("bench-a", shaped), ("bench-b", shaped)):
            tower = TowerProcess(tmp, name, {}, allow={client_id: ["sync"]})
            BlobStore(tower.dir / "blobs").add_file(blob, alias=blob.stem, kind="dataset")
            towers.append(tower.start())
        try:
            # The direct tower is reached directly; the other two only through shaping proxies.
            proxies = [RateLimitedProxy(t.port, args.rate_mbps * MB) for t in towers[1:]]
            client_address = f"127.0.0.1:{free_port()}"
            rns_dir = rnsnet.write_config(home / "rns-bench", listen=client_address, connect=[towers[0].address] + [
                f"127.0.0.1:{p.port}" for p in proxies])
            grid = Grid(home=home, rns_config=rns_dir)
            grid.wait_for(lambda entries: len(entries) == 3, 60)
            runs = args.runs
            ours, resource = [], []
            with resource_sink(tmp, client_address) as send:
                for k in range(runs):  # pairs: ours and a plain Resource of the same file, alternating the order
                    for side in (("ours", "resource") if k % 2 == 0 else ("resource", "ours")):
                        if side == "ours":
                            ours.append(timed_pull(grid, tmp / f"s1-{k}", "big", from_tower="bench-direct")[0])
                        else:
                            resource.append(send(big))
            try:
                rncp_default, default_timed, default_start = rncp_rates(tmp, big, "", runs)
            except RuntimeError as e:  # rns 0.9.4's rncp gives up on big incompressible files
                rncp_default, default_error = [], str(e).splitlines()[-1].strip()
            rncp_plain, plain_timed, plain_start = rncp_rates(tmp, big, "-C", runs)
            print(f"part 1: {args.size_mib} MiB over loopback TCP, MB/s, median of {runs} runs")
            print(f"  ours:               {spread(ours)}")
            if rncp_default:
                print(f"  rncp (default):     {spread(rncp_default)}; as timed {spread(default_timed)}; "
                      f"start-up {spread(default_start, '.2f')} s")
            else:
                print(f"  rncp (default):     failed: {default_error}")
            print(f"  rncp -C:            {spread(rncp_plain)}; as timed {spread(plain_timed)}; "
                  f"start-up {spread(plain_start, '.2f')} s")
            print(f"  plain RNS Resource: {spread(resource)}")
            vs_resource = [o / r for o, r in zip(ours, resource)]
            print(f"  ours / plain RNS Resource, per pair: {spread(vs_resource, '.2f')}")
            one, two = [], []
            for k in range(runs):
                one.append(timed_pull(grid, tmp / f"s2-{k}", "shaped", from_tower="bench-b")[0])
                rate, report = timed_pull(grid, tmp / f"s3-{k}", "shaped")
                two.append(rate)
            print(f"part 2: {args.shaped_mib} MiB, each source shaped to {args.rate_mbps:.1f} MB/s, "
                  f"alternating, median of {runs}")
            print(f"  one source:  {spread(one, '.2f')} MB/s")
            print(f"  two sources: {spread(two, '.2f')} MB/s (chunks per source, last run: {report.fetched})")
            best_rncp = max(statistics.median(rncp_default) if rncp_default else 0.0, statistics.median(rncp_plain))
            print(f"sync_vs_resource={statistics.median(vs_resource):.2f}")
            print(f"sync_vs_rncp={statistics.median(ours) / best_rncp:.2f}")
            print(f"two_sources_vs_one={statistics.median(two) / statistics.median(one):.2f}")
            grid.close()
        finally:
            rnsnet.stop()
            for tower in towers:
                tower.stop()


if __name__ == "__main__":
    main()
