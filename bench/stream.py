"""Streaming overhead of the grid: local llama-cpp-python vs the same model
through a tower on loopback RNS.

Same GGUF, prompt, parameters (temperature 0, fixed max_tokens) and llama.cpp
threads (1, what a test tower gets) on both sides; runs are interleaved and the median of each is reported. Figures, as
the caller sees them:

- TTFT: request sent -> first text received (ms). The grid's link is warm.
- tokens/s: (completion tokens - 1) / (last text - first text).

Last line: ``stream_ratio=<grid tokens/s / local tokens/s>``.
Goal (issue 2): ratio >= 0.98 and added TTFT <= 15 ms.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from llama_cpp import Llama

from reticulum_grid import identity, rnsnet
from reticulum_grid.client import Grid, Usage
from reticulum_grid.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.localgrid import TowerProcess

PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"


def local_run(llm, max_tokens):
    started = time.perf_counter()
    first = last = None
    tokens = 0
    for chunk in llm.create_completion(PROMPT, max_tokens=max_tokens, temperature=0.0, stream=True):
        if chunk["choices"][0]["text"]:
            last = time.perf_counter()
            first = first or last
        tokens += 1
    return first - started, (tokens - 1) / (last - first)


def grid_run(grid, max_tokens):
    started = time.perf_counter()
    first = last = None
    usage = None
    for piece in grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": PROMPT, "max_tokens": max_tokens,
                                               "temperature": 0.0}):
        if isinstance(piece, Usage):
            usage = piece
        elif piece:
            last = time.perf_counter()
            first = first or last
    return first - started, (usage.completion_tokens - 1) / (last - first)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    model = default_model_path()
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-") as tmp:
        home = Path(tmp) / "client"
        client_id = identity.load_or_create(home / "identity").hash.hex()
        tower = TowerProcess(tmp, "bench-tower", {DEFAULT_ALIAS: model}, allow={client_id: ["infer"]}).start()
        try:
            grid = Grid(home=home, connect=[tower.address])
            grid.route(DEFAULT_ALIAS, timeout=120)
            llm = Llama(model_path=model, n_ctx=4096, n_threads=1, n_threads_batch=1, verbose=False)
            local_run(llm, 8), grid_run(grid, 8)  # warm caches and the link
            local, remote = [], []
            for _ in range(args.runs):
                local.append(local_run(llm, args.max_tokens))
                remote.append(grid_run(grid, args.max_tokens))
            report(local, remote, args)
            grid.close()
        finally:
            rnsnet.stop()
            tower.stop()


def report(local, remote, args):
    l_ttft, l_tps = (statistics.median(x) for x in zip(*local))
    g_ttft, g_tps = (statistics.median(x) for x in zip(*remote))
    print(f"model={DEFAULT_ALIAS} max_tokens={args.max_tokens} runs={args.runs} (medians)")
    print(f"local: ttft_ms={l_ttft * 1000:.1f} tokens_per_s={l_tps:.1f}")
    print(f"grid:  ttft_ms={g_ttft * 1000:.1f} tokens_per_s={g_tps:.1f}")
    print(f"added_ttft_ms={(g_ttft - l_ttft) * 1000:.1f}")
    print(f"stream_ratio={g_tps / l_tps:.3f}")


if __name__ == "__main__":
    main()
