"""The grid on each kind of link, in the network lab (testbed/lab/: every host
in its own network namespace, links shaped by a relay; needs root).

For each path (tailnet, lora-fast, lora-long, two-hop) it starts a tower and
one client session that discovers the tower, runs the same chat request
once cold (the Link is set up first) and three times warm (on the kept
Link), and pulls a small blob. Printed per path, from the median warm run:

- ``tokens_per_s``: (completion tokens - 1) / (last text - first text), as every
  benchmark counts it (bench/common.py)
- ``ttft_s``: time to the first token (warm; cold in ``cold_ttft_s``)
- ``wire_bytes_per_token``: bytes the request put on every hop, both ways, per token
- ``airtime_ratio``: the request's time / the airtime of its bytes on the
  slowest hop (1.0 = the air never idles; goal <= 1.5 on lora-fast)
- ``discovery_s``: client start to the tower in its table
- ``sync_mb_s``: pulling the blob (its size in ``sync_bytes``, the time in ``sync_s``)

Run: ``sudo .venv/bin/python bench/link_profiles.py [--paths lora-fast,tailnet] [--max-tokens 16]``.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import tokens_per_s  # noqa: E402
from testbed.lab.profiles import PATHS, profile  # noqa: E402
from testbed.lab.topology import Lab  # noqa: E402
from testbed.requirements import bench_needs  # noqa: E402

#: Warm requests per path (the median is reported).
WARM_RUNS = 3
#: Seconds between the tower's start and the client's.
STARTED_S = 5.0
#: Blob pulled per path (bytes): small enough for the slow links' airtime.
SYNC_BYTES = {"tailnet": 8 << 20, "lora-fast": 8 << 10, "lora-long": 2 << 10, "two-hop": 8 << 10}


def measure(path, root, max_tokens):
    blob = root / "blob.bin"
    blob.write_bytes(os.urandom(SYNC_BYTES[path]))
    lab = Lab(root, path)
    try:
        lab.start_tower(roles=("infer", "sync"), blobs=[(blob, "bench-blob", "file")])
        time.sleep(STARTED_S)  # the client arrives after the tower's start announce has passed
        returncode, out, err = lab.run_client("testbed.lab.client_run", "--runs", str(1 + WARM_RUNS), "--max-tokens",
                                              str(max_tokens), "--pull", "bench-blob", timeout=900)
        result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        if returncode != 0 or len(result.get("runs", ())) < 1 + WARM_RUNS:
            result["error"] = (err.strip().splitlines() or ["client failed"])[-1]
        return result
    finally:
        lab.close()


def figures(path, result):
    hops = [profile(name) for name in PATHS[path]]
    cold, warm_runs = result["runs"][0], sorted(result["runs"][1:], key=lambda r: r["elapsed_s"])
    warm = warm_runs[len(warm_runs) // 2]  # the median: a lost packet makes one run much slower
    tokens = warm["completion_tokens"]
    airtime = max(h.payload_airtime(b) for h, b in zip(hops, warm["wire_bytes"]))
    rate = tokens_per_s(tokens, warm["ttft_s"], warm["last_s"])
    return {"path": path, "tokens": tokens, "tokens_per_s": round(rate, 1),
            "ttft_s": warm["ttft_s"], "cold_ttft_s": cold["ttft_s"], "elapsed_s": warm["elapsed_s"],
            "wire_bytes_per_token": round(sum(warm["wire_bytes"]) / tokens, 1),
            "airtime_ratio": round(warm["elapsed_s"] / airtime, 2) if airtime > 0.05 else None,
            "discovery_s": result["discovery_s"], "sync_mb_s": result["pull"]["mb_per_s"],
            "sync_bytes": result["pull"]["bytes"], "sync_s": result["pull"]["elapsed_s"],
            "same_text": all(r["text"] == cold["text"] for r in result["runs"])}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--max-tokens", type=int, default=16)
    a = p.parse_args()
    bench_needs("netns", "links")
    for path in a.paths.split(","):
        with tempfile.TemporaryDirectory(prefix=f"rngrid-bench-{path}-") as tmp:
            result = measure(path, Path(tmp), a.max_tokens)
        if result.get("error"):
            print(json.dumps({"path": path, "error": result["error"]}), flush=True)
            continue
        row = figures(path, result)
        print(json.dumps(row), flush=True)
        print(f"{path}: tokens_per_s={row['tokens_per_s']} ttft_s={row['ttft_s']} "
              f"wire_bytes_per_token={row['wire_bytes_per_token']} airtime_ratio={row['airtime_ratio']} "
              f"discovery_s={row['discovery_s']} sync_mb_s={row['sync_mb_s']}", flush=True)


if __name__ == "__main__":
    main()
