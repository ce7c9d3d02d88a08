"""Split inference cost: the same model on one tower vs split over two towers (reticulum_grid.split),
on loopback or over a shaped link between the towers.

Towers: "single" serves the model whole (it lends nothing); "coord" holds the
GGUF and coordinates; "worker" lends memory. Each lender lends 200 MiB (400
with a draft, whose need counts too), below the model's need, so the client
plans a split over both; llama.cpp threads
are 1 everywhere. ``--profile loopback`` runs them as processes on 127.0.0.1;
``lan`` and ``tailnet`` put coordinator and worker on two network namespaces
joined by tests/lab/bridge.py with that profile's rate, delay and loss (the
client and "single" on the coordinator's host; tests/lab/splitlab.py).
``--path dataplane`` (default) gives both lenders a data-plane address, so
RPC goes straight between them; ``--path rns`` leaves it to the RNS tunnel.

Runs alternate (single, split) at temperature 0 with a fixed max_tokens, one
slot on every side; both must produce exactly that many tokens
(bench.common.tokens_per_s). On loopback a third side runs in the same pairs:
llama.cpp alone, its llama-server --rpc over a ggml-rpc-server on 127.0.0.1
holding the plan's worker layers, no grid between (``llama_vs_single``, and
``split_vs_llama``: what the grid's split keeps of llama.cpp's). Also: TTFT of a
short and, in alternating pairs too, of a ~1,000-token prompt on each side; with ``--draft`` a
second set of towers runs the same pairs with a coordinator that holds a draft
model (the same weights under another name: every draft it makes is accepted,
so this is the ceiling of speculative decoding), reporting ``draft_*``
figures, the acceptance rate and ``draft_adds_ttft_1k_ms``, what the draft
adds to the 1k-prompt TTFT (``--draft-layers N``: a draft of the model's
first N blocks instead, which agrees less and costs less). A second set, because llama-server speculates
on every request once it holds a draft (it has no per-request switch). The coordinator's log says the bytes that crossed to the worker while
the split model loaded and how long it took (``load_mb_s``). ``estimate_tokens_per_s``
is what the client planned with (split/estimate.py) and ``round_trips_per_token``
the split's extra time per token in coordinator-worker round trips (the
estimate's ROUND_TRIPS_PER_STAGE comes from it).

On loopback, after the pairs, the coordinator's split runner is stopped and
one more request loads the same plan again: ``reload_bytes`` is what crossed
then and ``reload_bytes_vs_first`` its ratio to the first load's
``load_bytes`` (about 1: the worker keeps none of the bytes a peer sent).
``--worker-holds`` first puts the GGUF in the worker's store, so that the
second load's worker seeds its RPC tensor cache from it (split/tensorcache.py);
goal then: reload_bytes_vs_first <= 0.05. llama.cpp offers only tensors over
10 MiB by hash, none of the bundled model's layers: use ``--model``.

``--model GGUF`` splits another model (the GPU check's 8B-shaped one): the
coordinator then lends just under the model's need and the worker about a
tenth of it (``split_lends``), so the worker holds a few layers; ``--threads N``
sets llama.cpp's threads on every tower; ``--json FILE`` also writes the
figures (``run`` returns them).

``--strategy pipeline|experts|tensor`` plans the split with that strategy
(split/plan.py STRATEGIES; llama.cpp's own side runs the same one). experts
needs a mixture-of-experts model: without ``--model`` a Qwen3-MoE shape with
8 experts and random weights is written on the spot (tests/tiny_models.py,
~99 MiB, MOE_SHAPE) and both lenders lend MOE_LEND_MIB, which holds all but
its experts on the coordinator. ``estimate_error`` is |estimated - measured| /
measured of the split's tokens/s, the estimate being the one the client
planned with for this request's shape (split/strategy.py).

Last lines: ``profile=<p> path=<path> strategy=<s> split_vs_single=<split / single tokens/s>`` (median of
the pairs; with --draft ``split_draft_vs_single=`` before it), then ``estimate_error=``. Goal:
split_vs_single >= 0.8 on loopback for pipeline; estimate_error <= 0.3.
"""

import argparse
import contextlib
import json
import math
import re
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import psutil

from bench.common import time_stream, with_end
from reticulum_grid.client import Grid, Usage
from reticulum_grid.client.split import SplitStream, make_plan
from reticulum_grid.inference import generation, request as inference_request
from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers
from reticulum_grid.store import gguf_info
from reticulum_grid.store.blobstore import BlobStore

ALIAS = "lab-split"
PROMPT = "{k}. Count from {k} to 5000, separated by commas: {k},"
LONG = "{k}. " + "The quick brown fox jumps over the lazy dog. " * 100 + "Count from 1 to 5000: 1,"
LOADED = re.compile(r"split model loaded in ([0-9.]+) s over \d+ worker\(s\); (\d+) bytes crossed")
#: The worker's share of a model's need when the coordinator lends just under it (see split_lends).
WORKER_SHARE = 0.115
#: The MoE model --strategy experts writes when given none (tests/tiny_models.write_tiny), and what each lender
#: lends then (MiB): below its need (~243 MiB) with headroom, above all but its 48 MiB of experts with headroom.
MOE_SHAPE = {"arch": "qwen3moe", "layers": 8, "dim": 128, "ff": 512, "heads": 4, "experts": 8}
MOE_LEND_MIB = 230


def split_lends(model, n_ctx=4096):
    """(coordinator MiB, worker MiB) that make the planner split ``model`` with
    the worker holding a few of its layers: the coordinator alone falls short
    of the need plus the plan's headroom, both together hold it. The need is
    the towers' own estimate (store/gguf_info.need_mib, n_ctx 4096)."""
    need = gguf_info.need_mib(model, n_ctx, Path(model).stat().st_size)
    return need, math.ceil(need * WORKER_SHARE)


def default_lends(draft):
    """200 MiB each, below the bundled model's need; 400 with a draft, whose need counts too."""
    mib = 400 if draft else 200
    return mib, mib


def payload(k, max_tokens, long=False, speculative=False):
    return {"model": ALIAS, "prompt": (LONG if long else PROMPT).format(k=k), "max_tokens": max_tokens,
            "temperature": 0.0, "speculative": speculative}


def timed(stream, max_tokens):
    """(TTFT s, tokens/s, usage) of one stream."""
    return time_stream(stream, lambda p: not isinstance(p, Usage) and bool(p), max_tokens, "run")


def measure(grid, args, alone=None):
    """The paired runs on ``grid`` (towers single, coord, worker heard); a dict of figures.
    ``alone(placement)``, on loopback: a context manager giving llama.cpp's own split of
    the same layers, run(k, max_tokens, long) -> (TTFT s, tokens/s, usage), a third side."""
    grid.wait_for(lambda entries: len(entries) >= 3, 120)
    grid.route(ALIAS, tower="single", timeout=120)
    grid.caps_full(grid.towers(), timeout=60)  # each tower reads the GGUF's metadata once
    placement, entries = make_plan(grid, ALIAS, strategy=args.strategy, shape=(len(PROMPT) // 4, args.max_tokens))
    with alone(placement) if alone else contextlib.nullcontext() as llama:
        return _pairs(grid, args, placement, entries, llama)


def _pairs(grid, args, placement, entries, llama):
    def single(k, n=args.max_tokens, long=False):
        return timed(grid.execute("ai/inference", payload(k, n, long), tower="single"), n)

    def split(k, n=args.max_tokens, long=False, speculative=False):
        return timed(SplitStream(grid, payload(k, n, long, speculative), placement, entries), n)

    single(1, 8), split(2, 8)  # warm up; the first split run loads the split model
    # Planned again, with the link rates the coordinator measured while it loaded: the estimate to check.
    estimated = make_plan(grid, ALIAS, strategy=args.strategy, shape=(len(PROMPT) // 4, args.max_tokens))[0]
    out = {"plan": [f"{p.offer.name} layers {p.first}-{p.end - 1}" for p in placement.parts]}
    # With a draft the coordinator's llama-server speculates on every request: it has no per-request switch
    # (tools/server/server-schema.cpp leaves speculative.* out), so the split side is the drafted one.
    name = "draft" if args.draft else "split"
    sides = [("single", single), (name, lambda k, n=args.max_tokens, long=False: split(k, n, long, args.draft))]
    sides += [("llama", lambda k, n=args.max_tokens, long=False: llama(k, n, long))] if llama else []
    pairs = {name: [] for name, _ in sides}
    for k in range(args.runs):
        for side, run in (sides if k % 2 == 0 else sides[::-1]):
            pairs[side].append(run(100 + 137 * k))
    for side, runs in pairs.items():
        out[f"{side}_tokens_per_s"] = statistics.median(r[1] for r in runs)
        out[f"{side}_ttft_ms"] = statistics.median(r[0] for r in runs) * 1000
    ratio = lambda over, under: statistics.median(b[1] / a[1] for a, b in zip(pairs[under], pairs[over]))
    out[f"{name}_vs_single"] = ratio(name, "single")
    if llama:  # llama.cpp's own split: what the grid's split keeps of it
        out["llama_vs_single"], out["split_vs_llama"] = ratio("llama", "single"), ratio("split", "llama")
    if args.draft:
        usages = [r[2] for r in pairs["draft"]]
        out["draft_acceptance"] = sum(u.draft_accepted for u in usages) / max(1, sum(u.draft_tokens for u in usages))
        out["split_draft_vs_single"] = out.pop("draft_vs_single")
    # A ~1,000-token prompt's TTFT, in pairs as above: each side on the same prompts, alternating.
    long = {side: [] for side, _ in sides}
    for k in range(2):
        for side, run in (sides if k % 2 == 0 else sides[::-1]):
            long[side].append(run(900 + k, 8, long=True)[0])
    long_single, long_split = long["single"], long[name]
    prefix = "draft_" if args.draft else ""
    out[f"{prefix}added_ttft_ms"] = out[f"{name}_ttft_ms"] - out["single_ttft_ms"]
    # What the client planned with (split/estimate.py), against what it got.
    rtt = placement.workers[0].offer.rtt_s
    out["coordinator_rtt_ms"] = rtt * 1000
    if estimated.estimate is not None and estimated.towers == placement.towers:
        out["estimate_tokens_per_s"] = estimated.estimate.tokens_per_s
        out["estimate_error"] = abs(estimated.estimate.tokens_per_s / out[f"{name}_tokens_per_s"] - 1)
    if rtt > 0:  # the seconds a token costs beyond one tower's, in the worker's round trips
        out[f"{prefix}round_trips_per_token"] = (1 / out[f"{name}_tokens_per_s"] - 1 / out["single_tokens_per_s"]) / rtt
    out[f"{prefix}added_ttft_1k_ms"] = (statistics.median(long_split) - statistics.median(long_single)) * 1000
    if llama:
        out["llama_added_ttft_1k_ms"] = (statistics.median(long["llama"]) - statistics.median(long_single)) * 1000
    return out


@contextlib.contextmanager
def llama_alone(model, placement, threads, root):
    """llama.cpp's own split of ``placement``'s layers, no grid between: its
    llama-server (--rpc) over ggml-rpc-servers on 127.0.0.1, one per worker part,
    run the way a coordinator runs it (split/supervisor.py, one slot). Gives
    run(k, max_tokens, long) -> (TTFT s, tokens/s, Generation)."""
    from reticulum_grid.node.hardware import first_gpu_name
    from reticulum_grid.split.rpcworker import RpcWorker
    from reticulum_grid.split.supervisor import SplitModel
    gpu = first_gpu_name()
    # A tensor split's coordinator without a GPU computes its share in an RPC server of its own (split/tensor.py).
    count = len(placement.workers) + (placement.strategy == "tensor" and not gpu)
    servers = [RpcWorker(Path(root) / f"alone-rpc{i}.log", threads=threads, private=False) for i in range(count)]
    split = None
    try:
        split = SplitModel("alone", model, 4096, [s.endpoint() for s in servers], [p.layers for p in placement.parts],
                           Path(root) / "alone-split.log", threads=threads, gpu=gpu,
                           strategy=placement.strategy).start(timeout=300)

        def run(k, n, long=False):
            request = inference_request.parse({**payload(k, n, long), "model": "m", "stream_id": 0})
            result = generation.Generation()
            pieces = split.generate(request, threading.Event(), result)
            return time_stream(with_end(pieces, result), lambda p: isinstance(p, generation.Piece) and bool(p.data),
                               n, "llama.cpp")

        yield run
    finally:
        if split is not None:
            split.close()
        for server in servers:
            server.stop()


def loopback(args, tmp):
    model = args.model
    home = Path(tmp) / "client"
    client_id = identity.load_or_create(home / "identity").hash.hex()
    trust_local_towers(home)  # this client trusts the towers it starts
    ids = {n: identity.load_or_create(Path(tmp) / n / "identity").hash.hex() for n in ("coord", "worker")}
    (coord_mib, worker_mib), threads = args.lends, args.threads
    plane = "127.0.0.1" if args.path == "dataplane" else ""
    # One slot, as the split runner has: both sides decode one stream the same way.
    single = TowerProcess(tmp, "single", {ALIAS: {"path": model, "parallel": 1}}, allow={client_id: ["infer"]},
                          shard={"lend_mib": 0}, threads=threads)
    # The coordinator holds the model for split plans (and names its draft), loading nothing whole.
    held = {ALIAS: {"path": model, "parallel": 1, "preload": False, **({"draft": "lab-draft"} if args.draft else {})}}
    coord = TowerProcess(tmp, "coord", held, allow={client_id: ["infer"], ids["worker"]: ["shard"]},
                         shard={"lend_mib": coord_mib, "threads": threads}, threads=threads, dataplane=plane)
    if args.draft:
        BlobStore(coord.dir / "blobs").add_file(draft_model(model, tmp, args.draft_layers), alias="lab-draft",
                                               kind="model")
    towers = [single.start(), coord.start()]
    worker = TowerProcess(tmp, "worker", {}, allow={client_id: ["infer"], ids["coord"]: ["shard"]},
                          connect=[coord.address], shard={"lend_mib": worker_mib, "threads": threads},
                          threads=threads, dataplane=plane)
    towers.append(worker.start())
    try:
        grid = Grid(home=home, connect=[t.address for t in towers])
        alone = (lambda placement: llama_alone(model, placement, threads, tmp)) if args.alone else None
        figures = measure(grid, args, alone)
        if args.worker_holds:  # as `rngrid add` or a finished pull leaves it
            BlobStore(worker.dir / "blobs").add_file(model, alias=ALIAS, kind="model")
        drop_split_runner(coord.proc.pid)  # the same plan loads again on the next request
        placement, entries = make_plan(grid, ALIAS, strategy=args.strategy)
        timed(SplitStream(grid, payload(7, 8), placement, entries), 8)
        grid.close()
        return figures, coord.log()
    finally:
        rnsnet.stop()
        for tower in towers:
            tower.stop()


def lab(args, tmp):
    from tests.lab.splitlab import SplitLab
    from tests.requirements import bench_needs
    bench_needs("netns", "the towers sit on two hosts joined by a shaped link")
    draft = draft_model(args.model, tmp, args.draft_layers) if args.draft else None
    made = SplitLab(Path(tmp) / "lab", args.profile, args.model, lend_mib=max(args.lends), threads=args.threads,
                    draft=draft, dataplane=args.path == "dataplane")
    try:
        done = made.run([sys.executable, "-m", "bench.split", "--measure", str(made.client_home),
                         str(made.client_rns), "--runs", str(args.runs), "--max-tokens", str(args.max_tokens),
                         "--strategy", args.strategy]
                        + (["--draft"] if args.draft else []), timeout=3000)
        if done.returncode != 0:
            raise SystemExit(f"the measuring client failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1]), made.towers["coord"].log()
    finally:
        made.close()


def moe_model(tmp):
    """A Qwen3-MoE-shaped GGUF (MOE_SHAPE) with random weights and the bundled model's tokenizer, in ``tmp``."""
    from tests.tiny_models import write_tiny
    return str(write_tiny(Path(tmp) / "moe-qwen3.gguf", default_model_path(), **MOE_SHAPE))


def draft_model(model, tmp, layers=0):
    """The coordinator's draft: ``model``'s weights under another name, or with
    ``layers`` its first that many blocks only (a smaller draft that agrees less)."""
    from tests.tiny_models import renamed_copy, truncated_copy
    out = Path(tmp) / "draft.gguf"
    return truncated_copy(model, out, layers) if layers else renamed_copy(model, out)


def drop_split_runner(tower_pid):
    """Kill the split runner (llama-server --rpc) under the tower process ``tower_pid``,
    by its pid, so that the tower's next split request loads the model again."""
    for child in psutil.Process(tower_pid).children(recursive=True):
        try:
            if "--rpc" in child.cmdline():
                child.kill()
        except psutil.Error:  # a child that ended meanwhile
            continue


def load_figures(coord_log):
    """Bytes that crossed to the worker while the split model loaded the first
    time, the seconds it took and their MB/s, and, when it loaded again, the
    bytes of the last load and their ratio to the first's, from the
    coordinator's log ({} if absent)."""
    loads = LOADED.findall(coord_log)
    if not loads:
        return {}
    seconds, moved = float(loads[0][0]), int(loads[0][1])
    out = {"load_bytes": moved, "load_s": seconds, "load_mb_s": moved / 1e6 / max(seconds, 1e-3)}
    if len(loads) > 1:
        out["reload_bytes"] = int(loads[-1][1])
        out["reload_bytes_vs_first"] = out["reload_bytes"] / max(moved, 1)
    return out


def run(model=None, runs=5, max_tokens=96, threads=1, lends=None, root=None, profile="loopback",
        path="dataplane", draft=False, alone=True, worker_holds=False, draft_layers=0, strategy="pipeline"):
    """The comparison; returns its figures (measure's and load_figures' keys;
    the plan as text). ``lends``: (coordinator, worker) MiB, default_lends
    when None; ``root``: the towers' folder (default a temporary one);
    ``alone``: llama.cpp's own split as a third side (loopback only);
    ``worker_holds``: the worker gets the GGUF before the second load (loopback only);
    ``draft``: the coordinator holds a draft (draft_model, ``draft_layers`` blocks);
    ``strategy``: the split's (experts without ``model``: moe_model's)."""
    args = argparse.Namespace(model=str(model or default_model_path()), runs=runs, max_tokens=max_tokens,
                              threads=threads, lends=lends or default_lends(draft), profile=profile, path=path,
                              draft=draft, alone=alone, worker_holds=worker_holds, draft_layers=draft_layers,
                              strategy=strategy)
    with contextlib.nullcontext(root) if root else tempfile.TemporaryDirectory(prefix="rngrid-bench-") as tmp:
        if strategy == "experts" and not model:
            args.model, args.lends = moe_model(tmp), lends or (MOE_LEND_MIB, MOE_LEND_MIB)
        figures, coord_log = (loopback if profile == "loopback" else lab)(args, tmp)
    return {**figures, "plan": " | ".join(figures["plan"]), **load_figures(coord_log)}


def with_draft(args, lends, plain):
    """A second run whose coordinator holds a draft: its own figures (``draft_*``,
    ``split_draft_vs_single``) and ``draft_adds_ttft_1k_ms``, its 1k-prompt
    TTFT over that of the ``plain`` run's (the draft reads every prompt too)."""
    drafted = run(args.model or None, args.runs, args.max_tokens, args.threads, lends, profile=args.profile,
                  path=args.path, draft=True, alone=False, draft_layers=args.draft_layers)
    out = {key: value for key, value in drafted.items() if "draft" in key}
    out["draft_adds_ttft_1k_ms"] = out["draft_added_ttft_1k_ms"] - plain["added_ttft_1k_ms"]
    return out


def report(args, figures):
    for key, value in figures.items():
        print(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}")
    if args.draft:
        print(f"profile={args.profile} path={args.path} split_draft_vs_single={figures['split_draft_vs_single']:.3f}")
    print(f"profile={args.profile} path={args.path} strategy={args.strategy} "
          f"split_vs_single={figures['split_vs_single']:.3f}")
    print(f"estimate_error={figures.get('estimate_error', float('nan')):.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="loopback", choices=("loopback", "lan", "tailnet"))
    parser.add_argument("--path", default="dataplane", choices=("dataplane", "rns"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--draft", action="store_true", help="also measure speculative decoding with a draft")
    parser.add_argument("--draft-layers", type=int, default=0, metavar="N",
                        help="the draft keeps the model's first N blocks only (default: all, the same weights)")
    parser.add_argument("--model", default="", metavar="GGUF", help="split this model (default: the bundled one)")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads on every tower")
    parser.add_argument("--strategy", default="pipeline", choices=("pipeline", "experts", "tensor"))
    parser.add_argument("--worker-holds", action="store_true", help="the worker gets the GGUF before the second load (loopback)")
    parser.add_argument("--json", default="", metavar="FILE", help="also write the figures here")
    parser.add_argument("--measure", nargs=2, metavar=("HOME", "RNS_CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # inside the lab's client namespace: measure and print the figures as JSON
        grid = Grid(home=args.measure[0], rns_config=args.measure[1])
        print(json.dumps(measure(grid, args)))
        return
    lends = split_lends(args.model) if args.model else None
    figures = run(args.model or None, args.runs, args.max_tokens, args.threads, lends, profile=args.profile,
                  path=args.path, worker_holds=args.worker_holds, strategy=args.strategy)
    if args.draft:
        figures.update(with_draft(args, lends, figures))
    report(args, figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
