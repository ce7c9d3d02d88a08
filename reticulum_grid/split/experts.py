"""Expert placement for mixture-of-experts GGUF models.

An MoE layer's expert tensors (``blk.N.ffn_{gate,up,down}_exps``) are most of
its weights but only a few experts run per token. With expert placement the
expert tensors go to the worker towers (llama.cpp tensor buffer-type
overrides: a regex per worker naming its layers) and everything else, with
the attention and the output layer, stays on the coordinator.

``plan_experts`` is that placement's planner: the coordinator must hold all
but the experts, the fewest other towers the experts, each in proportion to
what it lends. Its Plan's parts are layer counts as a pipeline's are (the
wire and the coordinator read them alike), but a worker's count is its share
of the expert layers (``expert_layers``) and the coordinator's is a token 1+.
"""

import itertools
import os
from collections.abc import Iterable, Sequence

from reticulum_grid.split.plan import HEADROOM, MAX_OFFERS, MAX_TOWERS, Offer, Part, Plan, PlanError
from reticulum_grid.split.plan import _preference, _proportional
from reticulum_grid.store import gguf_info

EXPERT_PATTERN = "ffn_(gate|up|down)_exps"


def rpc_buffer_type(endpoint: str) -> str:
    """llama.cpp's name for the buffer type of the first device of the RPC
    server at ``endpoint`` (ggml-rpc.cpp: "RPC<device>[<endpoint>]")."""
    return f"RPC0[{endpoint}]"


def has_experts(path: str | os.PathLike[str]) -> bool:
    """True when the GGUF at ``path`` has expert tensors."""
    return gguf_info.facts(path).experts


def expert_layers(counts: Sequence[int], n_workers: int) -> list[tuple[int, int]]:
    """Layer ranges [(first, end), ...] of expert tensors per worker: all
    layers, divided among the workers in proportion to ``counts[:n_workers]``."""
    total = sum(counts)
    weights = counts[:n_workers]
    ranges: list[tuple[int, int]] = []
    first, scale = 0, sum(weights)
    for i, weight in enumerate(weights):
        end = total if i == n_workers - 1 else first + round(total * weight / scale)
        ranges.append((first, end))
        first = end
    return ranges


def overrides(path: object, counts: Sequence[int], worker_bufts: Sequence[str]) -> list[tuple[str, str]]:
    """[(regex, buffer type)] putting each worker's share of expert tensors on
    its buffer type. ``counts``: layers per part (workers first, coordinator
    last, as in the plan); ``path`` is read for the real layer count."""
    del path  # the plan's counts already sum to the model's layers
    out = []
    for buft, (first, end) in zip(worker_bufts, expert_layers(counts, len(worker_bufts))):
        if end > first:
            layers = "|".join(str(i) for i in range(first, end))
            out.append((rf"^blk\.({layers})\.{EXPERT_PATTERN}", buft))
    return out


def plan_experts(offers: Iterable[Offer], need_mib: int, n_layers: int, expert_mib: int,
                 headroom: float = HEADROOM) -> Plan:
    """The expert placement of an MoE model needing ``need_mib`` MiB, of which
    ``expert_mib`` are expert tensors, over ``n_layers`` layers: a coordinator
    lending the rest with ``headroom`` (one holding the GGUF first) and the
    fewest workers lending the experts with it. Raises PlanError (no experts,
    or no towers that fit, saying what is missing)."""
    if expert_mib <= 0 or expert_mib >= need_mib:
        raise PlanError("expert placement needs a mixture-of-experts model (this one has no expert tensors)")
    want_rest = int((need_mib - expert_mib) * (1 + headroom) + 0.999)
    want_experts = int(expert_mib * (1 + headroom) + 0.999)
    usable = sorted((o for o in offers if o.lend_mib > 0), key=_preference)[:MAX_OFFERS]
    best: tuple[Offer, tuple[Offer, ...]] | None = None
    for coordinator in sorted((o for o in usable if o.lend_mib >= want_rest),
                              key=lambda o: (not o.has_model, _preference(o))):
        workers = _fewest([o for o in usable if o is not coordinator], want_experts, n_layers - 1)
        if workers is not None and (best is None or len(workers) < len(best[1])):
            best = (coordinator, workers)
    if best is None:
        most = max((o.lend_mib for o in usable), default=0)
        raise PlanError(f"expert placement needs a coordinator lending ~{want_rest} MiB (all but the experts; the "
                        f"most one lends is {most} MiB) and workers lending ~{want_experts} MiB for the experts")
    return _layout(*best, need_mib, n_layers, expert_mib, want_rest, want_experts)


def _fewest(others: Sequence[Offer], wanted: int, most: int) -> tuple[Offer, ...] | None:
    """The fewest of ``others`` (at most ``most``) lending ``wanted`` MiB together, preferred first; None if none do."""
    for size in range(1, min(len(others), MAX_TOWERS - 1, most) + 1):
        fitting = [c for c in itertools.combinations(others, size) if sum(o.lend_mib for o in c) >= wanted]
        if fitting:
            return min(fitting, key=lambda c: [_preference(o) for o in c])
    return None


def _layout(coordinator: Offer, workers: tuple[Offer, ...], need_mib: int, n_layers: int, expert_mib: int,
            want_rest: int, want_experts: int) -> Plan:
    counts = _proportional([o.lend_mib for o in workers] + [min(o.lend_mib for o in workers)], n_layers)
    held = expert_layers(counts, len(workers))
    parts, first = [], 0
    for offer, count, (start, end) in zip(workers, counts, held):
        parts.append(Part(offer, first, first + count, -(-expert_mib * (end - start) // n_layers)))
        first += count
    own = Part(coordinator, first, n_layers, need_mib - expert_mib)
    reasons = [f"expert placement: coordinator {coordinator.name} holds attention, router and output "
               f"(~{want_rest} MiB with headroom; lends {coordinator.lend_mib} MiB)",
               f"{len(workers)} worker(s) hold the experts (~{want_experts} MiB with headroom)"]
    reasons += [f"{o.name}: experts of layers {start}-{end - 1}" for o, (start, end) in zip(workers, held)]
    return Plan(own, tuple(parts), need_mib, n_layers, tuple(reasons), strategy="experts")
