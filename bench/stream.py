"""Streaming overhead of the grid: the model's runner alone vs the same model
through a tower on loopback RNS.

One side streams straight from a llama-server runner over HTTP (what the
tower itself reads), the other through a tower (RNS Link, Channel, client):
the same GGUF, runner settings (slots, one llama.cpp thread, as a test tower
has) and parameters (temperature 0, fixed max_tokens). Each pair of runs
gets a prompt neither side has seen (a different number up front), so TTFT
is never a cached-prefix time; the order inside a pair alternates. Every run
must stop at max_tokens, so both sides produce exactly that many tokens, and
tokens/s is counted the same way on both (bench.common.tokens_per_s).
Figures are as the caller sees them:

- TTFT: request sent -> first text received (ms). The grid's link is warm.
- tokens/s: as above.

Medians over the runs are printed with their ranges; the last line is
``stream_ratio=<grid tokens/s / runner tokens/s>`` (the median of the per-pair ratios).
Goal: ratio >= 0.98 and added TTFT <= 15 ms.

Where a shortfall comes from: each side's engine reports its own decode time
(llama.cpp's ``predicted_ms``; the grid's end usage carries the tower's as
``decode_s``), so the ratio splits into ``transport`` (what the caller saw over
what its engine produced: the link's own cost) and ``engine`` (the tower's
llama-server rate over the runner's: the CPU a tower's own work takes from its
engine on a machine with few cores), each the median of the per-pair ratios.
"""

import argparse
import statistics
import tempfile
import threading
from pathlib import Path

from bench.common import report_pairs, time_stream, with_end
from reticulum_grid.client import Grid, Usage
from reticulum_grid.inference import generation, request as inference_request
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.inference.registry import MAX_AUTO_SLOTS
from reticulum_grid.inference.runner import Runner
from reticulum_grid.inference.runner_spec import RunnerSpec
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers

PROMPT = "{k}. Count from {k} to 5000, separated by commas: {k},"


def runner_run(runner, prompt, max_tokens):
    """One request straight to the runner, streamed: (TTFT s, tokens/s, the engine's own tokens/s)."""
    request = inference_request.parse({"model": "m", "prompt": prompt, "max_tokens": max_tokens,
                                       "temperature": 0.0, "stream_id": 0})
    result = generation.Generation()
    pieces = generation.generate(runner, request, threading.Event(), result)
    ttft, rate, usage = time_stream(with_end(pieces, result), lambda p: isinstance(p, generation.Piece) and bool(p.data),
                                    max_tokens, "runner")
    return ttft, rate, engine_rate(usage)


def grid_side(grid, prompt, max_tokens):
    """One request through the tower: (TTFT s, tokens/s, its engine's own tokens/s)."""
    pieces = grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": prompt, "max_tokens": max_tokens,
                                           "temperature": 0.0})
    ttft, rate, usage = time_stream(pieces, lambda p: not isinstance(p, Usage) and bool(p), max_tokens, "grid")
    return ttft, rate, engine_rate(usage)


def engine_rate(usage):
    """llama.cpp's own decode rate: the tokens after the first over its ``decode_s``."""
    if not usage.decode_s:
        raise RuntimeError("the engine reported no decode time")
    return (usage.completion_tokens - 1) / usage.decode_s


def report_sources(local, remote):
    """The per-pair medians of transport (grid's rate over its engine's) and engine (the tower's
    engine over the runner's)."""
    transport = statistics.median(r[1] / r[2] for r in remote)
    engine = statistics.median(r[2] / l[2] for l, r in zip(local, remote))
    print(f"where it goes: transport={transport:.3f} (grid tokens/s over its tower's engine) "
          f"engine={engine:.3f} (the tower's llama-server over the runner alone)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    model = default_model_path()
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-") as tmp:
        home = Path(tmp) / "client"
        client_id = identity.load_or_create(home / "identity").hash.hex()
        trust_local_towers(home)  # this client trusts the towers it starts
        tower = TowerProcess(tmp, "bench-tower", {DEFAULT_ALIAS: {"path": model, "parallel": MAX_AUTO_SLOTS}},
                             allow={client_id: ["infer"]}).start()
        runner = Runner(RunnerSpec(model, n_ctx=4096, parallel=MAX_AUTO_SLOTS, threads=1), Path(tmp) / "runner.log")
        try:
            runner.start()
            grid = Grid(home=home, connect=[tower.address])
            grid.route(DEFAULT_ALIAS, timeout=120)
            runner_run(runner, PROMPT.format(k=1), 8), grid_side(grid, PROMPT.format(k=2), 8)  # warm up
            local, remote = [], []
            for k in range(args.runs):
                prompt = PROMPT.format(k=100 + 137 * k)  # differs from the first digit on
                if k % 2:
                    remote.append(grid_side(grid, prompt, args.max_tokens))
                    local.append(runner_run(runner, prompt, args.max_tokens))
                else:
                    local.append(runner_run(runner, prompt, args.max_tokens))
                    remote.append(grid_side(grid, prompt, args.max_tokens))
            report_sources(local, remote)
            report_pairs([r[:2] for r in local], [r[:2] for r in remote], ("runner", "grid"), "stream_ratio", args,
                         DEFAULT_ALIAS)
            grid.close()
        finally:
            runner.close()
            rnsnet.stop()
            tower.stop()


if __name__ == "__main__":
    main()
