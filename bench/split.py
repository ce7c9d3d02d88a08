"""Split inference cost: the same model on one tower vs split over two or three towers
(reticulum_grid.split), on loopback or over shaped links between the towers.

Towers: "single" serves the model whole (it lends nothing); "coord" holds the
GGUF and coordinates; "worker" (and with ``--towers 3`` "worker2") lend
memory. They lend below the model's need so that the client plans a split over
all of them (bench/split_models.py); llama.cpp threads are 1 everywhere.
``--profile loopback`` runs them as processes on 127.0.0.1; ``lan`` and
``tailnet`` put the coordinator and each worker on network namespaces joined
by testbed/lab/bridge.py with that profile's rate, delay and loss (the client
and "single" on the coordinator's host; testbed/lab/splitlab.py).
``--path dataplane`` (default) gives the lenders a data-plane address, so
RPC goes straight between them; ``--path rns`` leaves it to the RNS tunnel.

The sides (bench/split_sides.py) run in pairs whose order alternates, at
temperature 0 with a fixed max_tokens, one slot on every side; each must
produce exactly that many tokens (bench.common.tokens_per_s): ``single``,
``split`` (the grid's split) and on loopback llama.cpp alone, no tower
between: ``raw_whole`` (its llama-server with the whole model) and
``raw_split`` (its llama-server --rpc straight to ggml-rpc-servers on
127.0.0.1 holding the same layers as the plan's workers):
``raw_whole_vs_single`` (one process without the grid against one tower),
``raw_split_vs_single`` (llama.cpp's split against llama.cpp whole) and
``grid_vs_raw`` (what the grid's split keeps of llama.cpp's; goal >= 0.95 on
loopback).
Also: TTFT of a short prompt, and, in pairs whose order alternates too, of a
~1,000-token prompt on each side (``--long-pairs``); with ``--draft`` a
second set of towers runs the same pairs with a coordinator that holds a draft
model (the same weights under another name: every draft it makes is accepted,
so this is the ceiling of speculative decoding), reporting ``draft_*``
figures, the acceptance rate and ``draft_adds_ttft_1k_ms``, what the draft
adds to the 1k-prompt TTFT (``--draft-layers N``: a draft of the model's
first N blocks instead, which agrees less and costs less). A second set, because llama-server speculates
on every request once it holds a draft (it has no per-request switch). The coordinator's log says the bytes that crossed to the workers while
the split model loaded and how long it took (``load_s``, ``load_mb_s``). ``estimate_tokens_per_s``
is what the client planned with (split/estimate.py) and ``round_trips_per_token``
the split's extra time per token in coordinator-worker round trips, summed over the workers (the
estimate's ROUND_TRIPS_PER_STAGE comes from it); ``estimate_rtt_ms`` the coordinator's RNS round trip
when the estimate was made, ``rpc_rtt_ms`` the RPC round trip it timed the way the split's bytes go
when it loaded, and ``rpc_round_trips_per_token`` that extra time in those (the experts estimate's
EXPERT_ROUND_TRIPS comes from it: per token over the layers whose experts a worker holds).

After the pairs, the coordinator's split runner is stopped and
one more request loads the same plan again: ``reload_bytes`` and ``reload_s``
are what crossed then and how long it took, ``reload_bytes_vs_first`` the
bytes' ratio to the first load's ``load_bytes`` (about 1: a worker keeps none
of the bytes a peer sent). ``--worker-holds`` first puts the GGUF in the
workers' stores, so that the second load's workers seed their RPC tensor cache
from it (split/tensorcache.py); goal then: reload_bytes_vs_first <= 0.05.
llama.cpp offers only tensors over 10 MiB by hash, none of the bundled model's
layers: use ``--model`` or ``--random-8b``.

``--model GGUF`` splits another model; ``--random-8b LAYERS`` writes one first
with the GPU check's writer (bench/gpu_models.py: Llama-3-8B's shape and the
bundled tokenizer, random Q8_0 weights, LAYERS of its 32 blocks). The
coordinator then lends just under the model's need and each worker about a
tenth of it (``split_lends``), so the workers hold a few layers; ``--threads N``
sets llama.cpp's threads on every tower; ``--json FILE`` also writes the
figures (``run`` returns them).

``--strategy pipeline|experts|tensor`` plans the split with that strategy
(split/plan.py STRATEGIES; llama.cpp's own side runs the same one). experts
needs a mixture-of-experts model: without ``--model`` a Qwen3-MoE shape with
8 experts and random weights is written on the spot (testbed/tiny_models.py,
~99 MiB, MOE_SHAPE) and both lenders lend MOE_LEND_MIB, which holds all but
its experts on the coordinator. ``estimate_error`` is |estimated - measured| /
measured of the split's tokens/s, the estimate being the one the client
planned with for this request's shape (split/strategy.py).

Last lines: ``raw_split_vs_single=`` and ``grid_vs_raw=`` (loopback), then
``profile=<p> path=<path> towers=<n> strategy=<s> split_vs_single=<split / single tokens/s>`` (medians of
the per-pair ratios; with --draft ``split_draft_vs_single=`` before it), then ``estimate_error=``. Goal:
split_vs_single >= 0.8 on loopback for pipeline; estimate_error <= 0.3.
"""

import argparse
import contextlib
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

import psutil

from bench import split_sides as sides
from bench.split_sides import ALIAS, payload, timed
from bench.split_models import MOE_LEND_MIB, default_lends, draft_model, moe_model, random_8b, split_lends
from reticulum_grid.client import Grid, estimates
from reticulum_grid.client.split import SplitStream, make_plan
from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers
from reticulum_grid.store.blobstore import BlobStore

LOADED = re.compile(r"split model loaded in ([0-9.]+) s over \d+ worker\(s\); (\d+) bytes crossed")
def worker_names(towers):
    """The workers' names, as testbed/lab/splitlab.py names them: "worker", "worker2"."""
    return [f"worker{i + 1 if i else ''}" for i in range(towers - 1)]


def measure(grid, args, raw=None):
    """The paired runs on ``grid`` (towers single, coord and the workers heard); a dict of figures.
    ``raw(placement)``, on loopback: a context manager giving llama.cpp's sides
    ([(name, run)], raw_pair), run in the same pairs."""
    grid.wait_for(lambda entries: len(entries) >= args.towers + 1, 120)
    grid.route(ALIAS, tower="single", timeout=120)
    grid.caps_full(grid.towers(), timeout=60)  # each tower reads the GGUF's metadata once
    placement, entries = make_plan(grid, ALIAS, strategy=args.strategy, shape=request_shape(args))
    if len(placement.parts) != args.towers:
        raise SystemExit(f"the client planned over {placement.towers}, not {args.towers} towers")
    with raw(placement) if raw else contextlib.nullcontext([]) as raw_sides:
        return _pairs(grid, args, placement, entries, raw_sides)


def request_shape(args):
    """(prompt tokens, max_tokens) of the bench's short requests, as the planner costs them (~4 bytes a token)."""
    return len(sides.PROMPT) // 4, args.max_tokens


def _pairs(grid, args, placement, entries, raw_sides):
    single = sides.single(grid)
    split = sides.grid_split(grid, placement, entries, speculative=args.draft)
    single(1, 8), split(2, 8)  # warm up; the first split run loads the split model
    out = {"plan": [f"{p.offer.name} layers {p.first}-{p.end - 1}" for p in placement.parts]}
    # With a draft the coordinator's llama-server speculates on every request: it has no per-request switch
    # (tools/server/server-schema.cpp leaves speculative.* out), so the split side is the drafted one.
    name = "draft" if args.draft else "split"
    pairing = [("single", single), (name, split), *raw_sides]
    pairs = sides.paired(pairing, args.runs, args.max_tokens)
    # Planned again, as for the next request: with the link rates the coordinator measured while it loaded and
    # the single tower's rate over the runs (the lenders serve no model: they read at their kind's measured
    # pace, client/estimates.py): the estimate to check.
    estimated = make_plan(grid, ALIAS, strategy=args.strategy, shape=request_shape(args))[0]
    for side, runs in pairs.items():
        out[f"{side}_tokens_per_s"] = statistics.median(r[1] for r in runs)
        out[f"{side}_ttft_ms"] = statistics.median(r[0] for r in runs) * 1000
    out[f"{name}_vs_single"] = sides.ratio(pairs, name, "single")
    if raw_sides:  # llama.cpp alone: what its own split keeps of one process, and the grid's of its split
        out["raw_whole_vs_single"] = sides.ratio(pairs, "raw_whole", "single")
        out["raw_split_vs_single"] = sides.ratio(pairs, "raw_split", "raw_whole")
        out["grid_vs_raw"] = sides.ratio(pairs, name, "raw_split")
    if args.draft:
        usages = [r[2] for r in pairs["draft"]]
        out["draft_acceptance"] = sum(u.draft_accepted for u in usages) / max(1, sum(u.draft_tokens for u in usages))
        out["split_draft_vs_single"] = out.pop("draft_vs_single")
    prefix = "draft_" if args.draft else ""
    out[f"{prefix}added_ttft_ms"] = out[f"{name}_ttft_ms"] - out["single_ttft_ms"]
    # What the client planned with (split/estimate.py), against what it got.
    rtts = [w.offer.rtt_s for w in placement.workers]
    out["coordinator_rtt_ms"] = statistics.mean(rtts) * 1000
    if estimated.estimate is not None and estimated.towers == placement.towers:
        out["estimate_tokens_per_s"] = estimated.estimate.tokens_per_s
        out["estimate_error"] = abs(estimated.estimate.tokens_per_s / out[f"{name}_tokens_per_s"] - 1)
    extra = 1 / out[f"{name}_tokens_per_s"] - 1 / out["single_tokens_per_s"]
    if sum(rtts) > 0:  # the seconds a token costs beyond one tower's, in round trips to each worker in turn
        out[f"{prefix}round_trips_per_token"] = extra / sum(rtts)
    # The coordinator's figures the estimate was made with: its RNS pings now, and the RPC round trips it timed
    # the way the split's bytes go when it loaded (split/probe.py); the extra time in those round trips.
    view = estimates.coordinator_view(grid, entries[placement.coordinator.offer.key],
                                      [entries[w.offer.key] for w in placement.workers])
    out["estimate_rtt_ms"] = statistics.mean(view.rtts.get(w.offer.key, 0.0) for w in placement.workers) * 1000
    rpc = [view.rpc_rtts.get(w.offer.key, 0.0) for w in placement.workers]
    out["rpc_rtt_ms"] = statistics.mean(rpc) * 1000
    if sum(rpc) > 0:
        out[f"{prefix}rpc_round_trips_per_token"] = extra / sum(rpc)
    if args.long_pairs:  # a ~1,000-token prompt's TTFT, in pairs as above
        long = sides.paired(pairing, args.long_pairs, 8, long=True, first_k=900)
        out[f"{prefix}added_ttft_1k_ms"] = sides.added_ttft_ms(long, name, "single")
        if raw_sides:
            out["raw_added_ttft_1k_ms"] = sides.added_ttft_ms(long, "raw_split", "raw_whole")
    return out


def lender(tmp, name, allow, lend_mib, args, plane, models=None, connect=()):
    return TowerProcess(tmp, name, models or {}, allow=allow, connect=connect,
                        shard={"lend_mib": lend_mib, "threads": args.threads}, threads=args.threads, dataplane=plane)


def loopback(args, tmp):
    model = args.model
    home = Path(tmp) / "client"
    client_id = identity.load_or_create(home / "identity").hash.hex()
    trust_local_towers(home)  # this client trusts the towers it starts
    names = ["coord", *worker_names(args.towers)]
    ids = {n: identity.load_or_create(Path(tmp) / n / "identity").hash.hex() for n in names}
    plane = "127.0.0.1" if args.path == "dataplane" else ""
    # One slot, as the split runner has: both sides decode one stream the same way.
    single = TowerProcess(tmp, "single", {ALIAS: {"path": model, "parallel": 1}}, allow={client_id: ["infer"]},
                          shard={"lend_mib": 0}, threads=args.threads)
    # The coordinator holds the model for split plans (and names its draft), loading nothing whole.
    held = {ALIAS: {"path": model, "parallel": 1, "preload": False, **({"draft": "lab-draft"} if args.draft else {})}}
    allow = {name: {client_id: ["infer"], **{ids[o]: ["shard"] for o in names if o != name}} for name in names}
    coord = lender(tmp, "coord", allow["coord"], args.lends[0], args, plane, held)
    if args.draft:
        BlobStore(coord.dir / "blobs").add_file(draft_model(model, tmp, args.draft_layers), alias="lab-draft",
                                               kind="model")
    towers = [single.start(), coord.start()]
    try:
        workers = [lender(tmp, name, allow[name], mib, args, plane, connect=[coord.address])
                   for name, mib in zip(names[1:], args.lends[1:])]
        towers += [w.start() for w in workers]
        grid = Grid(home=home, connect=[t.address for t in towers])
        raw = (lambda placement: raw_pair(model, placement, args.threads, tmp)) if args.raw else None
        figures = measure(grid, args, raw)
        before_reload(args, coord, workers)
        load_again(grid, args.strategy)
        grid.close()
        return figures, coord.log()
    finally:
        rnsnet.stop()
        for tower in towers:
            tower.stop()


@contextlib.contextmanager
def raw_pair(model, placement, threads, root):
    """[("raw_whole", run), ("raw_split", run)]: llama.cpp alone, whole and split as ``placement``."""
    with sides.raw_whole(model, threads, root) as whole, sides.raw_split(model, placement, threads, root) as split:
        yield [("raw_whole", whole), ("raw_split", split)]


def before_reload(args, coord, workers):
    """Stop ``coord``'s split runner, so that the next request loads the same plan
    again, the ``workers`` (towers) holding the GGUF first with ``--worker-holds``."""
    if args.worker_holds:  # as `rngrid add` or a finished pull leaves it
        for worker in workers:
            BlobStore(worker.dir / "blobs").add_file(args.model, alias=ALIAS, kind="model")
    drop_split_runner(coord.proc.pid)


def load_again(grid, strategy="pipeline"):
    """One short request on a new plan of ``strategy`` (the coordinator's log has the load's figures)."""
    placement, entries = make_plan(grid, ALIAS, strategy=strategy)
    timed(SplitStream(grid, payload(7, 8), placement, entries), 8)


def lab(args, tmp):
    from testbed.lab.splitlab import SplitLab
    from testbed.requirements import bench_needs
    bench_needs("netns", "the towers sit on hosts joined by shaped links")
    draft = draft_model(args.model, tmp, args.draft_layers) if args.draft else None
    made = SplitLab(Path(tmp) / "lab", args.profile, args.model, lends=args.lends, threads=args.threads,
                    draft=draft, dataplane=args.path == "dataplane")
    try:
        done = made.run([sys.executable, "-m", "bench.split", "--measure", str(made.client_home),
                         str(made.client_rns), "--towers", str(args.towers), "--runs", str(args.runs),
                         "--max-tokens", str(args.max_tokens), "--long-pairs", str(args.long_pairs),
                         "--strategy", args.strategy]
                        + (["--draft"] if args.draft else []), timeout=3000)
        if done.returncode != 0:
            raise SystemExit(f"the measuring client failed:\n{done.stderr[-3000:]}")
        before_reload(args, made.towers["coord"], [made.towers[n] for n in worker_names(args.towers)])
        again = made.run([sys.executable, "-m", "bench.split", "--measure", str(made.client_home),
                          str(made.client_rns), "--reload", "--strategy", args.strategy], timeout=1200)
        if again.returncode != 0:
            raise SystemExit(f"the second load failed:\n{again.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1]), made.towers["coord"].log()
    finally:
        made.close()


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
    """Bytes that crossed to the workers while the split model loaded the first
    time, the seconds it took and their MB/s, how many worker links of all loads
    went over the data plane and how many through the RNS tunnel, and, when it loaded again, the
    bytes and seconds of the last load and the bytes' ratio to the first's, from the
    coordinator's log ({} if absent)."""
    loads = LOADED.findall(coord_log)
    if not loads:
        return {}
    seconds, moved = float(loads[0][0]), int(loads[0][1])
    out = {"load_bytes": moved, "load_s": seconds, "load_mb_s": moved / 1e6 / max(seconds, 1e-3),
           "worker_links_dataplane": coord_log.count("RPC over the data plane"),
           "worker_links_tunnel": coord_log.count("RPC through the RNS tunnel")}
    if len(loads) > 1:
        out["reload_bytes"], out["reload_s"] = int(loads[-1][1]), float(loads[-1][0])
        out["reload_bytes_vs_first"] = out["reload_bytes"] / max(moved, 1)
    return out


def run(model=None, runs=5, max_tokens=96, threads=1, lends=None, root=None, profile="loopback",
        path="dataplane", draft=False, raw=True, worker_holds=False, draft_layers=0, towers=2, long_pairs=2,
        strategy="pipeline"):
    """The comparison; returns its figures (measure's and load_figures' keys;
    the plan as text). ``lends``: (coordinator, each worker) MiB, one worker per
    tower beyond the first (default_lends when None); ``root``: the towers' folder
    (default a temporary one); ``raw``: llama.cpp alone, whole and split, as sides too (loopback only);
    ``worker_holds``: the workers get the GGUF before the second load;
    ``draft``: the coordinator holds a draft (draft_model, ``draft_layers`` blocks);
    ``long_pairs``: pairs of ~1,000-token prompts (0: none);
    ``strategy``: the split's (experts without ``model``: moe_model's, each lender MOE_LEND_MIB)."""
    if strategy == "experts" and not model:
        lends = lends or (MOE_LEND_MIB,) * towers
    lends = tuple(lends or default_lends(draft, towers))
    if len(lends) != towers:
        raise ValueError(f"{towers} towers need {towers} lends, got {lends}")
    args = argparse.Namespace(model=str(model or default_model_path()), runs=runs, max_tokens=max_tokens,
                              threads=threads, lends=lends, profile=profile, path=path, draft=draft, raw=raw,
                              worker_holds=worker_holds, draft_layers=draft_layers, towers=towers,
                              long_pairs=long_pairs, strategy=strategy)
    with contextlib.nullcontext(root) if root else tempfile.TemporaryDirectory(prefix="rngrid-bench-") as tmp:
        if strategy == "experts" and not model:
            args.model = moe_model(tmp)
        figures, coord_log = (loopback if profile == "loopback" else lab)(args, tmp)
    return {**figures, "plan": " | ".join(figures["plan"]), **load_figures(coord_log)}


def with_draft(args, lends, plain):
    """A second run whose coordinator holds a draft: its own figures (``draft_*``,
    ``split_draft_vs_single``) and ``draft_adds_ttft_1k_ms``, its 1k-prompt
    TTFT over that of the ``plain`` run's (the draft reads every prompt too)."""
    drafted = run(args.model or None, args.runs, args.max_tokens, args.threads, lends, profile=args.profile,
                  path=args.path, draft=True, raw=False, draft_layers=args.draft_layers, towers=args.towers,
                  long_pairs=args.long_pairs, strategy=args.strategy)
    out = {key: value for key, value in drafted.items() if "draft" in key}
    if "draft_added_ttft_1k_ms" in out and "added_ttft_1k_ms" in plain:
        out["draft_adds_ttft_1k_ms"] = out["draft_added_ttft_1k_ms"] - plain["added_ttft_1k_ms"]
    return out


def report(args, figures):
    last = ("raw_split_vs_single", "grid_vs_raw", "split_draft_vs_single", "split_vs_single")
    for key, value in figures.items():
        if key not in last:
            print(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}")
    for key in last[:2]:
        if key in figures:
            print(f"{key}={figures[key]:.3f}")
    where = f"profile={args.profile} path={args.path} towers={args.towers} strategy={args.strategy}"
    if args.draft:
        print(f"{where} split_draft_vs_single={figures['split_draft_vs_single']:.3f}")
    print(f"{where} split_vs_single={figures['split_vs_single']:.3f}")
    print(f"estimate_error={figures.get('estimate_error', float('nan')):.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="loopback", choices=("loopback", "lan", "tailnet"))
    parser.add_argument("--path", default="dataplane", choices=("dataplane", "rns"))
    parser.add_argument("--towers", type=int, default=2, choices=(2, 3), help="towers the model is split over")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--long-pairs", type=int, default=2, metavar="N",
                        help="pairs of ~1,000-token prompts for the TTFT (0: none)")
    parser.add_argument("--draft", action="store_true", help="also measure speculative decoding with a draft")
    parser.add_argument("--draft-layers", type=int, default=0, metavar="N",
                        help="the draft keeps the model's first N blocks only (default: all, the same weights)")
    parser.add_argument("--model", default="", metavar="GGUF", help="split this model (default: the bundled one)")
    parser.add_argument("--random-8b", type=int, default=0, metavar="LAYERS",
                        help="split a random Llama-3-8B-shaped model of LAYERS blocks (32: the whole 8B), written first")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads on every tower")
    parser.add_argument("--strategy", default="pipeline", choices=("pipeline", "experts", "tensor"))
    parser.add_argument("--worker-holds", action="store_true", help="the workers get the GGUF before the second load")
    parser.add_argument("--json", default="", metavar="FILE", help="also write the figures here")
    parser.add_argument("--measure", nargs=2, metavar=("HOME", "RNS_CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--reload", action="store_true", help=argparse.SUPPRESS)  # with --measure: load_again
    args = parser.parse_args()
    if args.measure:  # inside the lab's client namespace: measure and print the figures as JSON
        grid = Grid(home=args.measure[0], rns_config=args.measure[1])
        if args.reload:
            load_again(grid, args.strategy)
        else:
            print(json.dumps(measure(grid, args)))
        return
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-model-") as made:
        if args.random_8b:
            args.model = str(random_8b(args.random_8b, made))
        lends = split_lends(args.model, args.towers) if args.model else None
        figures = run(args.model or None, args.runs, args.max_tokens, args.threads, lends, profile=args.profile,
                      path=args.path, worker_holds=args.worker_holds, towers=args.towers, long_pairs=args.long_pairs,
                      strategy=args.strategy)
        if args.draft:
            figures.update(with_draft(args, lends, figures))
    report(args, figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
