"""Overhead of the HTTP gateway: the same requests through `Grid` directly and
through `rngrid serve` with the `openai` client, streamed.

One tower process on loopback RNS; the gateway is its own process (`rngrid
serve`, as deployed) with the same identity; the Grid and the openai client
run in this process. Same model, parameters (temperature 0, fixed
max_tokens) and the same prompts on both sides: a pair is two prompts X and Y
(a different number up front), run as Grid X, gateway Y, gateway X, Grid Y.
No request follows one with its own prompt (nothing it asks is cached), and
each side goes first on one prompt and second on the other, so whatever the
tower keeps of an earlier request favours neither; each side's figure in a
pair is the mean of its two runs. tokens/s is counted the same way on both
sides: (max_tokens - 1) / (last text - first text), as the caller sees it
(bench/common.py).

Medians over the runs are printed with their ranges; the last line is
``gateway_ratio=<gateway tokens/s / Grid tokens/s>`` (the median of the
per-pair ratios), before it ``added_ttft_ms``. Goal (issue 13): ratio >= 0.97,
added TTFT <= 10 ms.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

from bench.common import grid_run, report_pairs, time_stream

from reticulum_grid.client import Grid
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.node.localgrid import TowerProcess, free_port, trust_local_towers, wait_port

PROMPT = "{k}. Count from {k} to 5000, separated by commas: {k},"


def gateway_run(client, prompt, max_tokens):
    # create() returns once the response has begun, which the gateway sends with the first text.
    started = time.perf_counter()
    chunks = client.completions.create(model=DEFAULT_ALIAS, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    return time_stream(chunks, lambda c: not c.usage and bool(c.choices and c.choices[0].text), max_tokens,
                       "gateway", started=started)[:2]


def mean_run(a, b):
    """The mean (TTFT s, tokens/s) of two runs."""
    return tuple((p + q) / 2 for p, q in zip(a, b))


def start_gateway(tmp, home, tower):
    """`rngrid serve` in its own process with this client's identity; (process, openai client)."""
    gateway_home = Path(tmp) / "gateway"
    gateway_home.mkdir()
    shutil.copy(home / "identity", gateway_home / "identity")
    trust_local_towers(gateway_home, follow=False)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "reticulum_grid", "--home", str(gateway_home), "serve",
                             "--listen", f"127.0.0.1:{port}", "--connect", tower.address],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not wait_port(port, 60):
        proc.kill()
        raise RuntimeError("rngrid serve did not listen within 60 s")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    deadline = time.monotonic() + 60
    while not any(m.id == DEFAULT_ALIAS for m in client.models.list()):
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the gateway never heard the tower")
        time.sleep(0.2)
    return proc, client


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-") as tmp:
        home = Path(tmp) / "client"
        client_id = identity.load_or_create(home / "identity").hash.hex()
        trust_local_towers(home)  # this client trusts the towers it starts
        tower = TowerProcess(tmp, "bench-tower", {DEFAULT_ALIAS: default_model_path()},
                             allow={client_id: ["infer"]}).start()
        proc = None
        try:
            grid = Grid(home=home, connect=[tower.address])
            grid.route(DEFAULT_ALIAS, timeout=120)
            proc, client = start_gateway(tmp, home, tower)
            grid_run(grid, PROMPT.format(k=1), 8, DEFAULT_ALIAS), gateway_run(client, PROMPT.format(k=2), 8)  # warm links and caches
            direct, through = [], []
            for k in range(args.runs):
                # Both sides reach the same tower with the same two prompts (their numbers
                # differ from each other's and from the pair before's).
                x, y = PROMPT.format(k=200 + 137 * k), PROMPT.format(k=700 + 137 * k)
                g_x = grid_run(grid, x, args.max_tokens, DEFAULT_ALIAS)
                w_y = gateway_run(client, y, args.max_tokens)
                w_x = gateway_run(client, x, args.max_tokens)
                g_y = grid_run(grid, y, args.max_tokens, DEFAULT_ALIAS)
                direct.append(mean_run(g_x, g_y))
                through.append(mean_run(w_x, w_y))
            report_pairs(direct, through, ("Grid", "gateway"), "gateway_ratio", args, DEFAULT_ALIAS)
            grid.close()
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(15)
            rnsnet.stop()
            tower.stop()


if __name__ == "__main__":
    main()
