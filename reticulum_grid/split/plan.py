"""Placement: which towers hold which layers of one model. A pure function.

``plan(offers, need_mib, n_layers)`` picks the fewest towers whose lent
memory holds the model with HEADROOM to spare; among equally few, towers that
are not training, fewer hops, lower RTT and more tokens/s come first (every
token crosses each worker once: RPC waits for each reply), and a set that
includes a tower holding the GGUF beats one that would need a copy. Layers go to each
tower in proportion to the memory it lends. The coordinator (the tower that
runs the model and streams to the client) is the one lending the most; it
keeps the last layers and the output layer, so the logits (n_vocab x 4 bytes
per token) never cross the network. Workers hold the first layers, in order.
"""

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Spare memory a plan keeps over the model's need (fraction).
HEADROOM = 0.10
#: Offers considered at most (the best by preference); bounds the search.
MAX_OFFERS = 12
#: Towers one plan uses at most (llama.cpp's GGML_RPC_MAX_SERVERS is 16).
MAX_TOWERS = 8


class PlanError(ValueError):
    """No set of towers holds the model; the message says how much is missing."""


@dataclass(frozen=True)
class Offer:
    """One tower's offer. ``lend_mib``: memory it lends (MiB); ``rtt_s``: round
    trip from the client (s); ``tokens_per_s``: its announced rate;
    ``has_model``: it holds the GGUF already (else it is synced there first
    if it becomes the coordinator)."""
    name: str
    key: bytes = b""
    lend_mib: int = 0
    rtt_s: float = 0.0
    hops: int = 1
    training: bool = False
    tokens_per_s: float = 0.0
    has_model: bool = False


@dataclass(frozen=True)
class Part:
    """Layers [first, end) of the model on one tower, and the MiB they take there."""
    offer: Offer
    first: int
    end: int
    mib: int

    @property
    def layers(self) -> int:
        return self.end - self.first


@dataclass(frozen=True)
class Estimate:
    """What a plan (or one tower) is estimated to do (split/estimate.py makes
    it): ``tokens_per_s``; ``added_ttft_s``: seconds the split adds before the
    first token (0 for one tower); ``where``: the towers, in words;
    ``link_bytes_per_token``: bytes each worker's link carries per generated
    token, both ways (0 for one tower)."""
    tokens_per_s: float
    added_ttft_s: float
    where: str
    link_bytes_per_token: int = 0

    def to_map(self) -> dict[str, Any]:
        return {"tokens_per_s": round(self.tokens_per_s, 2), "added_ttft_s": round(self.added_ttft_s, 3),
                "where": self.where, "link_bytes_per_token": self.link_bytes_per_token}


#: How a plan spreads a model: layers in order, an MoE model's expert tensors on the workers
#: (split/experts.py), or each layer's weights across every tower (split/tensor.py).
STRATEGIES = ("pipeline", "experts", "tensor")


@dataclass(frozen=True)
class Plan:
    """``workers`` hold the first layers in order; ``coordinator`` the rest and
    the output layer. ``reasons``: why, in words. Under another ``strategy``
    the parts' layer counts are each tower's share: of the expert tensors
    (experts: workers only) or of every layer's weights (tensor)."""
    coordinator: Part
    workers: tuple[Part, ...] = ()
    need_mib: int = 0
    n_layers: int = 0
    reasons: tuple[str, ...] = field(default=(), compare=False)
    estimate: Estimate | None = field(default=None, compare=False)  # split/estimate.py's, once made
    strategy: str = "pipeline"

    @property
    def parts(self) -> tuple[Part, ...]:
        return self.workers + (self.coordinator,)

    @property
    def towers(self) -> list[str]:
        return [p.offer.name for p in self.parts]

    def to_map(self) -> dict[str, Any]:
        """The plan as plain data (for --json and for the coordinator)."""
        return {"strategy": self.strategy, "need_mib": self.need_mib, "n_layers": self.n_layers,
                "reasons": list(self.reasons),
                **({"estimate": self.estimate.to_map()} if self.estimate is not None else {}),
                "parts": [{"tower": p.offer.name, "destination": p.offer.key.hex(), "first": p.first, "end": p.end,
                           "mib": p.mib, "role": "coordinator" if p is self.coordinator else "worker"}
                          for p in self.parts]}


def _preference(offer: Offer) -> tuple[bool, int, float, float, int, str]:
    return (offer.training, offer.hops, round(offer.rtt_s, 3), -offer.tokens_per_s, -offer.lend_mib, offer.name)


def plan(offers: Iterable[Offer], need_mib: int, n_layers: int, headroom: float = HEADROOM) -> Plan:
    """The placement for a model needing ``need_mib`` MiB with ``n_layers``
    repeating layers. Raises PlanError when the offers cannot hold it."""
    if n_layers < 1 or need_mib < 1:
        raise PlanError(f"a model needs at least one layer and 1 MiB (got {n_layers} layers, {need_mib} MiB)")
    wanted = int(need_mib * (1 + headroom) + 0.999)
    usable = sorted((o for o in offers if o.lend_mib > 0), key=_preference)[:MAX_OFFERS]
    biggest = sorted((o.lend_mib for o in usable), reverse=True)
    for size in range(1, min(len(usable), MAX_TOWERS, n_layers) + 1):
        if sum(biggest[:size]) < wanted:
            continue
        fitting = [c for c in itertools.combinations(usable, size) if sum(o.lend_mib for o in c) >= wanted]
        # A set with a tower that holds the GGUF spares a copy of the whole file.
        best = min(fitting, key=lambda c: (not any(o.has_model for o in c), [_preference(o) for o in c]))
        return _layout(best, need_mib, n_layers, wanted, len(usable))
    have = sum(biggest[:MAX_TOWERS])
    raise PlanError(f"the model needs ~{wanted} MiB with headroom; the {len(usable)} towers lending memory "
                    f"offer {have} MiB together")


def _layout(chosen: Sequence[Offer], need_mib: int, n_layers: int, wanted: int, considered: int) -> Plan:
    coordinator = max(chosen, key=lambda o: (o.lend_mib, o.has_model, not o.training, -o.hops))
    workers = [o for o in chosen if o is not coordinator]
    order = workers + [coordinator]
    counts = _proportional([o.lend_mib for o in order], n_layers)
    parts: list[Part] = []
    first = 0
    for offer, count in zip(order, counts):
        parts.append(Part(offer, first, first + count, -(-need_mib * count // n_layers)))
        first += count
    reasons = [f"{len(chosen)} of {considered} towers lending memory hold ~{wanted} MiB (need {need_mib} MiB "
               f"+ {int(HEADROOM * 100)}% headroom)" if len(chosen) > 1 else
               f"{coordinator.name} alone lends enough ({coordinator.lend_mib} MiB >= {wanted} MiB)",
               f"coordinator {coordinator.name}: lends the most ({coordinator.lend_mib} MiB), keeps the output layer",
               "layers in proportion to lent memory"]
    reasons += [f"{o.name}: training, used last" for o in chosen if o.training]
    return Plan(parts[-1], tuple(parts[:-1]), need_mib, n_layers, tuple(reasons))


def _proportional(weights: Sequence[int], total: int) -> list[int]:
    """Integers summing to ``total``, proportional to ``weights``, each >= 1
    (largest remainder)."""
    scale = sum(weights)
    exact = [w * (total - len(weights)) / scale for w in weights]
    counts = [1 + int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: int(exact[i]) - exact[i])
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    return counts
