"""Pieces the benchmarks share: the one tokens/s formula, timing a token
stream, printing paired figures, starting requests at once and running a
network lab's client.

Run benchmarks as modules from the repository root (``python -m bench.stream``).
"""

import statistics
import threading
import time


def tokens_per_s(tokens, first_s, last_s, first_tokens=1):
    """The tokens/s of every benchmark here: ``tokens`` generated, the first text
    seen at ``first_s`` carrying ``first_tokens`` of them, and the last at ``last_s``
    (seconds on one clock), counted as the caller sees them: (tokens - first_tokens)
    / (last - first). The first piece's time is TTFT's, so its tokens are not
    counted again (a piece may carry several: a slow link coalesces them); the
    end message is not text."""
    if tokens - first_tokens < 1 or last_s <= first_s:
        raise ValueError(f"no rate from {tokens} tokens ({first_tokens} in the first piece) between {first_s} and "
                         f"{last_s} s")
    return (tokens - first_tokens) / (last_s - first_s)


def tokens_so_far(pieces, piece):
    """Tokens generated up to and including ``piece``, the first text of ``pieces``:
    a runner's piece says how many it carries (``n``), a Grid stream counts them
    (``generated``, from the token ids the tower sent); else one."""
    n = getattr(piece, "n", None)
    return n if isinstance(n, int) and n > 0 else max(1, getattr(pieces, "generated", 1))


def spread(values, scale=1.0):
    """'median (range min-max)' of ``values`` times ``scale``, one decimal."""
    values = [v * scale for v in values]
    return f"{statistics.median(values):.1f} (range {min(values):.1f}-{max(values):.1f})"


def time_stream(pieces, is_text, max_tokens, label, started=None, clock=time.perf_counter):
    """Consume ``pieces`` (a stream started just now, or at ``started`` on
    ``clock``) and return (TTFT s, tokens/s, last piece). ``is_text(piece)`` says
    whether a piece is generated text; the tokens of the first are counted by
    ``tokens_so_far``; the last piece must carry ``completion_tokens`` (a usage)
    equal to ``max_tokens``, so both sides of a comparison count the same tokens
    (``tokens_per_s``). Raises RuntimeError otherwise."""
    started = started or clock()
    first = last = usage = None
    first_tokens = 1
    for piece in pieces:
        if is_text(piece):
            last = clock()
            if first is None:
                first, first_tokens = last, tokens_so_far(pieces, piece)
        else:
            # A usage itself (client Usage, a runner's Generation), or a piece that carries one.
            usage = piece if hasattr(piece, "completion_tokens") else getattr(piece, "usage", None)
    done = getattr(usage, "completion_tokens", None)
    if done != max_tokens:
        raise RuntimeError(f"{label} run ended after {done} of {max_tokens} tokens")
    return first - started, tokens_per_s(max_tokens, first, last, first_tokens), usage


def with_end(pieces, result):
    """``pieces`` (a runner's generation.Piece stream), then ``result`` (its
    Generation, which carries completion_tokens): what time_stream reads."""
    yield from pieces
    yield result


def report_pairs(base, other, names, ratio_key, args, model):
    """Print medians and ranges of paired (TTFT s, tokens/s) runs; the last lines are
    ``added_ttft_ms=`` and ``<ratio_key>=`` (median of the per-pair ``other/base`` tokens/s)."""
    (b_ttft, b_tps), (o_ttft, o_tps) = zip(*base), zip(*other)
    width = max(len(n) for n in names) + 1
    print(f"model={model} max_tokens={args.max_tokens} runs={args.runs} (medians, ranges)")
    for name, ttft, tps in ((names[0], b_ttft, b_tps), (names[1], o_ttft, o_tps)):
        print(f"{name + ':':<{width}} ttft_ms={spread(ttft, 1000)} tokens_per_s={spread(tps)}")
    added = [(o - b) * 1000 for o, b in zip(o_ttft, b_ttft)]
    ratios = [o / b for o, b in zip(o_tps, b_tps)]
    print(f"per pair: added_ttft_ms {spread(added)}, {names[1]}/{names[0]} tokens/s "
          f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")
    print(f"added_ttft_ms={statistics.median(added):.1f}")
    print(f"{ratio_key}={statistics.median(ratios):.3f}")


def grid_run(grid, prompt, max_tokens, model, **route):
    """One temperature-0 raw-prompt request through ``grid``: (TTFT s, tokens/s)."""
    from reticulum_grid.client import Usage
    pieces = grid.execute("ai/inference", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                           "temperature": 0.0}, **route)
    return time_stream(pieces, lambda p: not isinstance(p, Usage) and bool(p), max_tokens, "grid")[:2]


def run_at_once(target, items, join_s=600):
    """``target(item)`` for each of ``items``, each on a thread of its own, all
    started before any is waited for; each wait lasts at most ``join_s`` seconds."""
    threads = [threading.Thread(target=target, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
