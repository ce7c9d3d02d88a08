"""A LoRA adapter pulled over a LoRa-class link that drops out on the way.

In the network lab (testbed/lab/, needs root): a tower holding a ``--size``
byte adapter (default 1 MiB) behind one ``--path`` hop (default lora-fast:
5.5 kbit/s, 250 ms, 1 % loss, 500-byte MTU, half duplex). The client pulls it
with ``rngrid pull --force`` (the estimate is far above the default limit);
once ``--drop-after`` bytes have crossed the hop, the hop goes down for
``--drop-s`` seconds (everything sent meanwhile is lost) and comes back.

Printed: the elapsed time, the payload's airtime at the hop's rate, their
ratio, whether the pulled file equals the tower's (BLAKE3 verified by the
store, compared byte for byte here), and the relay's counters. Last line:
``radio_sync_ok=<0|1> ratio=<elapsed / airtime>``.

Run: ``sudo .venv/bin/python -m bench.radio_sync [--size 1048576] [--drop-s 30]``.
"""

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from testbed.lab.profiles import profile
from testbed.lab.topology import Lab
from testbed.requirements import bench_needs


def cut(lab, after_bytes, down_s, deadline_s):
    start = lab.hop_stats(0)["bytes_ba"]
    deadline = time.monotonic() + deadline_s
    while lab.hop_stats(0)["bytes_ba"] < start + after_bytes and time.monotonic() < deadline:
        time.sleep(0.2)
    lab.set_hop(0, up=False)
    print(f"hop down at {lab.hop_stats(0)['bytes_ba'] - start} bytes for {down_s:.0f} s", flush=True)
    time.sleep(down_s)
    lab.set_hop(0, up=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--path", default="lora-fast")
    p.add_argument("--size", type=int, default=1 << 20, help="adapter size (bytes)")
    p.add_argument("--drop-after", type=int, default=64 << 10, help="bytes across the hop before it drops")
    p.add_argument("--drop-s", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=3600.0)
    a = p.parse_args()
    bench_needs("netns", "radio_sync")
    with tempfile.TemporaryDirectory(prefix="rngrid-radio-sync-") as tmp:
        root = Path(tmp)
        blob = root / "adapter.bin"
        blob.write_bytes(os.urandom(a.size))
        lab = Lab(root, a.path)
        try:
            lab.start_tower(roles=("sync",), models={}, blobs=[(blob, "radio-adapter", "file")])
            cutter = threading.Thread(target=cut, args=(lab, a.drop_after, a.drop_s, a.timeout), daemon=True)
            started = time.monotonic()
            cutter.start()
            result = lab.rngrid("pull", "radio-adapter", "--from", "lab-tower", "--force", "--json",
                                "--rns-config", str(lab.client_rns), timeout=a.timeout)
            elapsed = time.monotonic() - started
            stats = lab.hop_stats(0)
            pulled = [q for q in (lab.client_home / "blobs").rglob("*") if q.is_file() and q.stat().st_size == a.size]
            same = any(q.read_bytes() == blob.read_bytes() for q in pulled)
        finally:
            lab.close()
    airtime = profile(a.path).payload_airtime(a.size)
    ok = result.returncode == 0 and same
    print(json.dumps({"path": a.path, "bytes": a.size, "drop_s": a.drop_s, "rc": result.returncode,
                      "elapsed_s": round(elapsed, 1), "payload_airtime_s": round(airtime, 1), "same_file": same,
                      "relay": stats, "stderr_tail": result.stderr[-600:] if not ok else ""}), flush=True)
    print(f"radio_sync_ok={int(ok)} ratio={elapsed / airtime:.2f}", flush=True)


if __name__ == "__main__":
    main()
