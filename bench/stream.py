"""Streaming overhead of the grid: local llama-cpp-python vs the same model
through a tower on loopback RNS.

Same GGUF, parameters (temperature 0, fixed max_tokens) and llama.cpp threads
(1, what a test tower gets) on both sides. Each pair of runs gets a prompt
neither side has seen (a different number up front), so TTFT is never a
cached-prefix time; the order inside a pair alternates. Every run must stop
at max_tokens, so both sides produce exactly that many tokens, and tokens/s
is counted the same way on both: (max_tokens - 1) / (last text - first text).
Figures are as the caller sees them:

- TTFT: request sent -> first text received (ms). The grid's link is warm.
- tokens/s: as above.

Medians over the runs are printed with their ranges; the last line is
``stream_ratio=<grid tokens/s / local tokens/s>`` (the median of the per-pair ratios).
Goal (issue 2): ratio >= 0.98 and added TTFT <= 15 ms.
"""

import argparse
import tempfile
import time
from pathlib import Path

from llama_cpp import Llama

from bench.common import grid_run, report_pairs
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.client import Grid
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers

PROMPT = "{k}. Count from {k} to 5000, separated by commas: {k},"


def local_run(llm, prompt, max_tokens):
    started = time.perf_counter()
    first = last = finish = None
    for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, stream=True):
        choice = chunk["choices"][0]
        if choice["text"]:
            last = time.perf_counter()
            first = first or last
        finish = choice.get("finish_reason") or finish
    if finish != "length":
        raise RuntimeError(f"local run ended with {finish!r} before {max_tokens} tokens; pick another prompt")
    return first - started, (max_tokens - 1) / (last - first)


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
        tower = TowerProcess(tmp, "bench-tower", {DEFAULT_ALIAS: model}, allow={client_id: ["infer"]}).start()
        try:
            grid = Grid(home=home, connect=[tower.address])
            grid.route(DEFAULT_ALIAS, timeout=120)
            llm = Llama(model_path=model, n_ctx=4096, n_threads=1, n_threads_batch=1, verbose=False)
            local_run(llm, PROMPT.format(k=1), 8), grid_run(grid, PROMPT.format(k=2), 8, DEFAULT_ALIAS)  # warm caches and link
            local, remote = [], []
            for k in range(args.runs):
                prompt = PROMPT.format(k=100 + 137 * k)  # differs from the first digit on
                if k % 2:
                    remote.append(grid_run(grid, prompt, args.max_tokens, DEFAULT_ALIAS))
                    local.append(local_run(llm, prompt, args.max_tokens))
                else:
                    local.append(local_run(llm, prompt, args.max_tokens))
                    remote.append(grid_run(grid, prompt, args.max_tokens, DEFAULT_ALIAS))
            report_pairs(local, remote, ("local", "grid"), "stream_ratio", args, DEFAULT_ALIAS)
            grid.close()
        finally:
            rnsnet.stop()
            tower.stop()


if __name__ == "__main__":
    main()
