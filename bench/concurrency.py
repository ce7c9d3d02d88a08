"""Concurrent streams on one tower: what batching in the runner gives, and what the grid keeps of it.

One tower serves the bundled model with ``--slots`` parallel slots; N = 1, 2,
4, 8 streams of ``--max-tokens`` tokens each (temperature 0, each its own
prompt) start together from one client. Beside it, in the same run, the same
llama-server binary with the same slots and threads is driven directly over
HTTP with the same requests. Per N and side: the aggregate rate (all tokens
over the wall time from the first request to the last token) and the median
per-stream rate (bench.common.tokens_per_s). Rounds alternate which side goes
first.

Last lines: ``batch_gain_4=<grid aggregate at 4 / grid at 1>`` and
``concurrent_vs_llama_server=<grid aggregate / direct aggregate at N=4>`` (goal >= 0.95).
``--model PATH`` serves another GGUF (the GPU check's 8B-shaped one) and
``--json FILE`` also writes the figures there (``throughput`` returns them).

``--determinism`` instead measures how often text at temperature 0 is the
same: a request alone on a fresh slot twice; with three other streams in the
batch; and a stream continued from its first k tokens (k = 1, 8, 24), once
evaluated as one batch and once replayed token by token as towers do
(inference/generation.py ``_replay``).
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import run_at_once, spread, tokens_per_s
from reticulum_grid.client import Grid, Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.inference.runner import Runner
from reticulum_grid.inference.runner_spec import RunnerSpec
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers

QUESTIONS = ["List three colours and say why each matters.", "Why is the sky blue?", "Name two rivers in Europe.",
             "What is a prime number? Give examples.", "Write a haiku about the sea.", "Explain rain to a child.",
             "What do cats eat?", "Describe a good breakfast.", "How does a bicycle work?", "What is music?"]


#: Throughput prompts never stop before max_tokens: every stream counts the same tokens.
COUNTING = "{k}. Count from {k} to 5000, separated by commas: {k},"


def chat(question, round_):
    return [{"role": "user", "content": f"({round_}) {question}"}]


def direct_stream(runner, prompt, max_tokens):
    """One streamed completion straight to the runner: arrival times of its text pieces."""
    times = []
    for event in runner.stream("/completion", {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0,
                                               "cache_prompt": True}):
        if event.get("content"):
            times.append(time.perf_counter())
        if event.get("stop") and event.get("tokens_predicted") != max_tokens:
            raise RuntimeError(f"direct run ended after {event.get('tokens_predicted')} of {max_tokens} tokens")
    return times


def grid_stream(grid, prompt, max_tokens, alias=DEFAULT_ALIAS):
    times = []
    for piece in grid.execute("ai/inference", {"model": alias, "prompt": prompt,
                                               "max_tokens": max_tokens, "temperature": 0.0}):
        if isinstance(piece, Usage):
            if piece.completion_tokens != max_tokens:
                raise RuntimeError(f"grid run ended after {piece.completion_tokens} of {max_tokens} tokens")
        elif piece:
            times.append(time.perf_counter())
    return times


def together(run, n, round_, max_tokens):
    """(aggregate tokens/s, [per-stream tokens/s]) of ``n`` streams started at once."""
    results, errors = [None] * n, []

    def one(i):
        try:
            results[i] = run(COUNTING.format(k=100 * round_ + 7 * i + 3), max_tokens)
        except Exception as e:  # reported after the join
            errors.append(e)

    started = time.perf_counter()
    run_at_once(one, range(n))
    if errors or any(r is None for r in results):
        raise RuntimeError(f"{len(errors)} of {n} streams failed: {errors[:1]}")
    wall = max(times[-1] for times in results) - started
    return n * max_tokens / wall, [tokens_per_s(max_tokens, t[0], t[-1]) for t in results]


def _pair(sides, order, n, round_, max_tokens, tries=3):
    """{side: together(...)} for both sides with the same prompts. A prompt the
    model ends early (an end token inside a batch: every stream must count
    max_tokens) is replaced, on both sides, by the next set of prompts."""
    for attempt in range(tries):
        try:
            return {side: together(sides[side], n, round_ + 1000 * attempt, max_tokens) for side in order}
        except RuntimeError as e:
            print(f"# {n} streams, prompts {round_ + 1000 * attempt}: {e}; the next prompts instead", flush=True)
    raise RuntimeError(f"{tries} sets of prompts ended early at {n} streams")


def throughput(args, tmp):
    """Run the comparison and print it; returns the figures (the module doc's), per N and side."""
    model = args.model or default_model_path()
    alias = DEFAULT_ALIAS if not args.model else "bench-model"
    home = Path(tmp) / "client"
    client_id = identity.load_or_create(home / "identity").hash.hex()
    trust_local_towers(home)  # this client trusts the tower it starts
    tower = TowerProcess(tmp, "conc-tower", {alias: {"path": model, "parallel": args.slots}},
                         allow={client_id: ["infer"]}, threads=args.threads,
                         limits={"queue_depth": max(args.counts)}).start()
    runner = Runner(RunnerSpec(model, n_ctx=4096, parallel=args.slots, threads=args.threads), Path(tmp) / "direct.log")
    try:
        runner.start()
        grid = Grid(home=home, connect=[tower.address])
        grid.route(alias, timeout=180)
        sides = {"grid": lambda m, n: grid_stream(grid, m, n, alias),
                 "direct": lambda m, n: direct_stream(runner, m, n)}
        for run in sides.values():
            together(run, args.slots, 0, 8)
        figures = {(side, n): [] for side in sides for n in args.counts}
        for round_ in range(args.rounds):
            for n in args.counts:
                order = ("grid", "direct") if round_ % 2 == 0 else ("direct", "grid")
                for side, measured in _pair(sides, order, n, 1 + round_ * 10 + n, args.max_tokens).items():
                    figures[(side, n)].append(measured)
        print(f"model={alias} slots={args.slots} threads={args.threads or 'default'} "
              f"max_tokens={args.max_tokens} rounds={args.rounds} (medians, ranges)")
        aggregate, out = {}, {"model": Path(model).name, "slots": args.slots, "max_tokens": args.max_tokens,
                              "rounds": args.rounds, "streams": {}}
        for n in args.counts:
            for side in sides:
                runs = figures[(side, n)]
                aggregate[(side, n)] = statistics.median(a for a, _ in runs)
                per = [p for _, streams in runs for p in streams]
                print(f"N={n} {side:6} aggregate_tokens_per_s={spread([a for a, _ in runs])} "
                      f"per_stream_tokens_per_s={spread(per)}")
                out["streams"].setdefault(str(n), {})[side] = {
                    "aggregate_tokens_per_s": round(aggregate[(side, n)], 2),
                    "aggregate_runs": [round(a, 2) for a, _ in runs],
                    "per_stream_tokens_per_s_median": round(statistics.median(per), 2)}
        if 1 in args.counts and 4 in args.counts:
            out["batch_gain_4"] = round(aggregate[('grid', 4)] / aggregate[('grid', 1)], 3)
            print(f"batch_gain_4={out['batch_gain_4']:.2f}")
        if 4 in args.counts:
            out["concurrent_vs_llama_server"] = round(aggregate[('grid', 4)] / aggregate[('direct', 4)], 3)
            print(f"concurrent_vs_llama_server={out['concurrent_vs_llama_server']:.3f}")
        grid.close()
        return out
    finally:
        runner.close()
        rnsnet.stop()
        tower.stop()


def determinism(args, tmp):
    """How often text at temperature 0 is the same (see the module doc)."""
    runner = Runner(RunnerSpec(args.model or default_model_path(), n_ctx=4096, parallel=args.slots,
                               threads=args.threads), Path(tmp) / "det.log").start()

    def tokens(question):
        prompt = runner.call("POST", "/apply-template", {"messages": chat(question, "d")})["prompt"]
        return runner.call("POST", "/tokenize", {"content": prompt, "add_special": True,
                                                 "parse_special": True})["tokens"]

    def run(prompt, n, cache=True, slot=-1):
        return runner.call("POST", "/completion", {"prompt": prompt, "n_predict": n, "temperature": 0.0,
                                                   "cache_prompt": cache, "id_slot": slot, "return_tokens": True})

    try:
        prompts = {q: tokens(q) for q in QUESTIONS}
        alone = {q: run(prompts[q], args.max_tokens, cache=False)["tokens"] for q in QUESTIONS}
        again = sum(run(prompts[q], args.max_tokens, cache=False)["tokens"] == alone[q] for q in QUESTIONS)
        print(f"alone_twice_same={again}/{len(QUESTIONS)}")
        batched = {}

        def one(q):
            batched[q] = run(prompts[q], args.max_tokens, cache=False)["tokens"]

        for group in (QUESTIONS[:4], QUESTIONS[4:8]):
            run_at_once(one, group)
        print(f"batched_with_3_others_same={sum(batched[q] == alone[q] for q in batched)}/{len(batched)}")
        as_batch = replayed = tried = 0
        for q in QUESTIONS:
            ids = alone[q]
            for k in (1, 8, 24):
                if k >= len(ids):
                    continue
                tried += 1
                as_batch += ids[:k] + run(prompts[q] + ids[:k], len(ids) - k, cache=False)["tokens"] == ids
                slot = run(prompts[q], 0, cache=False)["id_slot"]
                for end in range(1, k):
                    run(prompts[q] + ids[:end], 0, slot=slot)
                replayed += ids[:k] + run(prompts[q] + ids[:k], len(ids) - k, slot=slot)["tokens"] == ids
        print(f"continued_as_one_batch_same={as_batch}/{tried}")
        print(f"continued_replayed_same={replayed}/{tried}")
    finally:
        runner.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: its default)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--determinism", action="store_true")
    parser.add_argument("--model", default="", metavar="GGUF", help="serve this model (default: the bundled one)")
    parser.add_argument("--json", default="", metavar="FILE", help="also write the throughput figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-") as tmp:
        result = (determinism if args.determinism else throughput)(args, tmp)
    if args.json and result is not None:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
