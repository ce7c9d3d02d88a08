"""Split inference cost: the same model on one tower vs split over two towers
whose llama.cpp RPC traffic crosses an RNS Link (reticulum_grid.split).

Three tower processes on loopback: "single" serves the model whole (it lends
nothing), "coord" holds the GGUF and "worker" lends memory; each lends
200 MiB, below the model's need, so the client plans a split over both.
llama.cpp threads are 1 everywhere. Runs alternate (single, split) with
temperature 0 and a fixed max_tokens; both must produce exactly that many
tokens; tokens/s = (max_tokens - 1) / (last text - first text).

- ``tunnel_mb_s``: the worker's share of the weights (bytes of its layers'
  tensors in the GGUF) over the first split request's extra time (its load,
  which sends those weights through the tunnel), in MB/s; a lower bound.
- ``added_ttft_ms``: median warm TTFT split - single.
- last line ``split_vs_single=<split tokens/s / single tokens/s>`` (median of the pairs).
Goal (issue 11): split_vs_single >= 0.8 on loopback.

``--model PATH`` splits another GGUF (the GPU check's 8B-shaped one); then
the coordinator lends just under the model's need and the worker about a
tenth of it (``split_lends``), so the worker takes a few layers and the
weights that cross the tunnel stay a few hundred MB. ``--threads N`` sets
llama.cpp's threads; ``--json FILE`` also writes the figures (``run`` returns them).
"""

import argparse
import contextlib
import json
import math
import statistics
import tempfile
from pathlib import Path

import gguf

from bench.common import time_stream
from reticulum_grid.client import Grid, Usage
from reticulum_grid.client.split import SplitStream, make_plan
from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers
from reticulum_grid.store import gguf_info
from reticulum_grid.store.blobstore import BlobStore

ALIAS = "bench-split"
PROMPT = "{k}. Count from {k} to 5000, separated by commas: {k},"


def timed(stream, max_tokens):
    """(TTFT s, tokens/s, the tower's own TTFT s) of one stream."""
    ttft, tps, usage = time_stream(stream, lambda p: not isinstance(p, Usage) and bool(p), max_tokens, "split")
    return ttft, tps, usage.tower_ttft_s


def worker_bytes(path, first, end):
    """Bytes of the tensors of layers [first, end) in the GGUF."""
    layers = {f"blk.{i}." for i in range(first, end)}
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if any(t.name.startswith(p) for p in layers))


#: The worker's share of a model's need when the coordinator lends just under it (see split_lends).
WORKER_SHARE = 0.115


def split_lends(model, n_ctx=4096):
    """(coordinator MiB, worker MiB) that make the planner split ``model``
    with the worker holding a few of its layers: the coordinator alone falls
    short of the need plus the plan's headroom, both together hold it. The
    need is the towers' own estimate for a model in their store (n_ctx 4096,
    one slot: store/gguf_info.need_mib)."""
    need = gguf_info.need_mib(model, n_ctx, Path(model).stat().st_size)
    return need, math.ceil(need * WORKER_SHARE)


def run(model=None, runs=5, max_tokens=96, threads=1, lends=None, root=None):
    """The comparison (printed as it goes); returns its figures. ``root``: the
    towers' folder (default a temporary one)."""
    model = model or default_model_path()
    coord_mib, worker_mib = lends or (200, 200)
    with contextlib.nullcontext(root) if root else tempfile.TemporaryDirectory(prefix="rngrid-bench-") as tmp:
        home = Path(tmp) / "client"
        client_id = identity.load_or_create(home / "identity").hash.hex()
        trust_local_towers(home)  # this client trusts the towers it starts
        ids = {n: identity.load_or_create(Path(tmp) / n / "identity").hash.hex() for n in ("coord", "worker")}
        single = TowerProcess(tmp, "single", {ALIAS: model}, allow={client_id: ["infer"]}, shard={"lend_mib": 0},
                              threads=threads)
        coord = TowerProcess(tmp, "coord", {}, allow={client_id: ["infer"], ids["worker"]: ["shard"]},
                             shard={"lend_mib": coord_mib, "threads": threads}, threads=threads)
        BlobStore(coord.dir / "blobs").add_file(model, alias=ALIAS, kind="model")
        towers = [single.start(), coord.start()]
        worker = TowerProcess(tmp, "worker", {}, allow={client_id: ["infer"], ids["coord"]: ["shard"]},
                              connect=[coord.address], shard={"lend_mib": worker_mib, "threads": threads},
                              threads=threads)
        towers.append(worker.start())
        try:
            grid = Grid(home=home, connect=[t.address for t in towers])
            grid.wait_for(lambda entries: len(entries) >= 3, 120)
            grid.route(ALIAS, tower="single", timeout=120)
            grid.caps_full(grid.towers(), timeout=60)  # each tower reads the GGUF's metadata once

            def run_single(k, max_tokens):
                return timed(grid.execute("ai/inference", _payload(k, max_tokens), tower="single"), max_tokens)

            def run_split(k, max_tokens):
                placement, entries = make_plan(grid, ALIAS)
                return timed(SplitStream(grid, _payload(k, max_tokens), placement, entries), max_tokens)

            placement, _ = make_plan(grid, ALIAS)
            plan_text = " | ".join(f"{p.offer.name} layers {p.first}-{p.end - 1}" for p in placement.parts)
            print(f"plan: {plan_text}")
            run_single(1, 8)
            cold_ttft = run_split(2, 8)[0]  # loads the split: the worker's weights cross the tunnel
            warm_ttft = run_split(3, 8)[0]
            sent = worker_bytes(model, placement.workers[0].first, placement.workers[0].end)
            single_runs, split_runs = [], []
            for k in range(runs):
                prompt_k = 100 + 137 * k
                pair = [(single_runs, run_single), (split_runs, run_split)]
                for runs_, fn in (pair if k % 2 == 0 else pair[::-1]):
                    runs_.append(fn(prompt_k, max_tokens))
            figures = report(single_runs, split_runs, sent, cold_ttft - warm_ttft)
            grid.close()
            return {"model": Path(model).name, "plan": plan_text, "lend_mib": [coord_mib, worker_mib],
                    "runs": runs, "max_tokens": max_tokens, **figures}
        finally:
            rnsnet.stop()
            for tower in towers:
                tower.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--model", default="", metavar="GGUF", help="split this model (default: the bundled one)")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads per tower")
    parser.add_argument("--json", default="", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()
    figures = run(args.model or None, args.runs, args.max_tokens, args.threads,
                  split_lends(args.model) if args.model else None)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


def _payload(k, max_tokens):
    return {"model": ALIAS, "prompt": PROMPT.format(k=k), "max_tokens": max_tokens, "temperature": 0.0}


def report(single_runs, split_runs, sent, load_s):
    """Print the figures; returns them."""
    def med(values):
        return statistics.median(values)
    ratios = [b[1] / a[1] for a, b in zip(single_runs, split_runs)]
    out = {}
    for name, runs in (("single", single_runs), ("split", split_runs)):
        out[name] = {"tokens_per_s": round(med([r[1] for r in runs]), 2),
                     "ttft_ms": round(med([r[0] for r in runs]) * 1000, 1),
                     "tower_ttft_ms": round(med([r[2] for r in runs]) * 1000, 1)}
        print(f"{name}: {out[name]['tokens_per_s']:.1f} tokens/s, TTFT {out[name]['ttft_ms']:.0f} ms "
              f"(on the tower {out[name]['tower_ttft_ms']:.0f} ms)")
    out.update(worker_weights_mb=round(sent / 1e6, 1), split_load_s=round(load_s, 2),
               added_ttft_ms=round((med([r[0] for r in split_runs]) - med([r[0] for r in single_runs])) * 1000, 1),
               tunnel_mb_s=round(sent / 1e6 / max(load_s, 1e-3), 1), split_vs_single=round(med(ratios), 3))
    print(f"worker weights {sent / 1e6:.1f} MB, split load {load_s:.1f} s")
    print(f"added_ttft_ms={out['added_ttft_ms']:.0f}")
    print(f"tunnel_mb_s={out['tunnel_mb_s']:.1f}")
    print(f"split_vs_single={out['split_vs_single']:.3f}")
    return out


if __name__ == "__main__":
    main()
