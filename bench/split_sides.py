"""The sides bench/split.py compares, and how it pairs them.

A side is a function ``run(k, max_tokens, long=False) -> (TTFT s, tokens/s,
usage)`` that streams one request at temperature 0 (prompt number ``k``, the
~1,000-token prompt when ``long``): ``single`` (one tower serving the model
whole), ``grid_split`` (the grid's split: a plan through towers and their
tunnels or data plane), and with no tower between, llama.cpp alone:
``raw_whole`` (its llama-server holding the whole model) and ``raw_split``
(its llama-server --rpc straight to ggml-rpc-servers on 127.0.0.1 holding the
plan's layers).
Every side decodes with one slot. ``paired`` runs the sides in alternating
order, so each goes first as often as the others.
"""

import contextlib
import statistics
import threading
from pathlib import Path

from bench.common import time_stream, with_end
from reticulum_grid.client import Usage
from reticulum_grid.client.split import SplitStream
from reticulum_grid.inference import generation, request as inference_request

ALIAS = "lab-split"
PROMPT = "{k}. Count from {k} to 5000, separated by commas: {k},"
LONG = "{k}. " + "The quick brown fox jumps over the lazy dog. " * 100 + "Count from 1 to 5000: 1,"


def payload(k, max_tokens, long=False, speculative=False):
    return {"model": ALIAS, "prompt": (LONG if long else PROMPT).format(k=k), "max_tokens": max_tokens,
            "temperature": 0.0, "speculative": speculative}


def timed(stream, max_tokens):
    """(TTFT s, tokens/s, usage) of one Grid stream."""
    return time_stream(stream, lambda p: not isinstance(p, Usage) and bool(p), max_tokens, "run")


def single(grid, tower="single"):
    """The side of ``tower`` serving the model whole."""
    def run(k, max_tokens, long=False):
        return timed(grid.execute("ai/inference", payload(k, max_tokens, long), tower=tower), max_tokens)
    return run


def grid_split(grid, placement, entries, speculative=False):
    """The side of the grid's split on ``placement`` (client/split.py's Plan and its entries)."""
    def run(k, max_tokens, long=False):
        return timed(SplitStream(grid, payload(k, max_tokens, long, speculative), placement, entries), max_tokens)
    return run


def _runner_side(runner_run):
    """A side streaming from ``runner_run(request, cancel, result)`` (pieces of a llama-server runner)."""
    def run(k, max_tokens, long=False):
        request = inference_request.parse({**payload(k, max_tokens, long), "model": "m", "stream_id": 0})
        result = generation.Generation()
        pieces = runner_run(request, threading.Event(), result)
        return time_stream(with_end(pieces, result), lambda p: isinstance(p, generation.Piece) and bool(p.data),
                           max_tokens, "llama.cpp")
    return run


@contextlib.contextmanager
def raw_whole(model, threads, root):
    """The side of llama.cpp's llama-server holding ``model`` whole, one slot and
    ``threads`` threads, as a tower runs it (inference/runner.py), log under ``root``."""
    from reticulum_grid.inference.runner import Runner
    from reticulum_grid.inference.runner_spec import RunnerSpec
    runner = Runner(RunnerSpec(str(model), n_ctx=4096, parallel=1, threads=threads), Path(root) / "raw-whole.log",
                    name="raw-whole")
    try:
        runner.start(600)
        yield _runner_side(lambda request, cancel, result: generation.generate(runner, request, cancel, result))
    finally:
        runner.close()


@contextlib.contextmanager
def raw_split(model, placement, threads, root):
    """The side of llama.cpp's own split of ``placement``'s layers: one
    ggml-rpc-server on 127.0.0.1 per worker part, and a llama-server --rpc over
    them run the way a coordinator runs it (split/supervisor.py: the same
    layout, one slot, ``threads`` threads), logs under ``root``."""
    from reticulum_grid.node.hardware import first_gpu_name
    from reticulum_grid.split.rpcworker import RpcWorker
    from reticulum_grid.split.supervisor import SplitModel
    gpu = first_gpu_name()
    # A tensor split's coordinator without a GPU computes its share in an RPC server of its own (split/tensor.py).
    count = len(placement.workers) + (placement.strategy == "tensor" and not gpu)
    servers = [RpcWorker(Path(root) / f"raw-rpc{i}.log", threads=threads, private=False) for i in range(count)]
    model_run = None
    try:
        model_run = SplitModel("raw", model, 4096, [s.endpoint() for s in servers], [p.layers for p in placement.parts],
                               Path(root) / "raw-split.log", threads=threads, gpu=gpu,
                               strategy=placement.strategy).start(timeout=600)
        yield _runner_side(model_run.generate)
    finally:
        if model_run is not None:
            model_run.close()
        for server in servers:
            server.stop()


def paired(sides, count, max_tokens, long=False, first_k=100):
    """Run ``sides`` ([(name, run)]) ``count`` times each, in pairs whose order
    alternates (forward, then backward), every side of a pair on the same
    prompt. Returns {name: [(TTFT s, tokens/s, usage), ...]} in pair order."""
    out = {name: [] for name, _ in sides}
    for i in range(count):
        k = first_k + 137 * i
        for name, run in (sides if i % 2 == 0 else sides[::-1]):
            out[name].append(run(k, max_tokens, long))
    return out


def ratio(pairs, over, under):
    """The median over the pairs of side ``over``'s tokens/s over side ``under``'s."""
    return statistics.median(b[1] / a[1] for a, b in zip(pairs[under], pairs[over]))


def added_ttft_ms(pairs, over, under):
    """Median TTFT of side ``over`` minus that of side ``under`` (ms)."""
    return (statistics.median(r[0] for r in pairs[over]) - statistics.median(r[0] for r in pairs[under])) * 1000
