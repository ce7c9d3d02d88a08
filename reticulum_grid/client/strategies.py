"""``--split auto`` on the client: the plan of every strategy that fits, each
costed for this request (split/strategy.py: prompt length, max_tokens, the
towers' bandwidth, the coordinator's round trips and link rates), and the
fastest kept, its reasons saying each candidate's estimate and why it won.

A request's prompt length is estimated from its text (PROMPT_BYTES_PER_TOKEN:
the client holds no tokenizer); the plans are made over the would-be
coordinator's view of the others (client/split.py make_plan).
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from announce.table import TowerEntry
from reticulum_grid.client import estimates
from reticulum_grid.client.parts import GridParts
from reticulum_grid.split import estimate, strategy
from reticulum_grid.split.plan import STRATEGIES, Estimate, Offer, Plan, PlanError

#: UTF-8 bytes per token of ordinary text (BPE tokenizers of English: 4 or so).
PROMPT_BYTES_PER_TOKEN = 4
#: What a request without max_tokens generates (as the towers default it).
DEFAULT_MAX_TOKENS = 256
#: A request's (prompt tokens, max_tokens) when none is known (route without a prompt).
DEFAULT_SHAPE = (100, DEFAULT_MAX_TOKENS)

#: Place(strategy, offers) -> Plan; raises PlanError.
Place = Callable[[str, list[Offer]], Plan]


def shape_of(payload: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, max_tokens) of an ai/inference ``payload``, the prompt's estimated from its text."""
    prompt = payload.get("prompt")
    text = prompt if isinstance(prompt, str) else ""
    for message in payload.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        text += content if isinstance(content, str) else ""
    asked = payload.get("max_tokens")
    return (max(1, len(text.encode("utf-8")) // PROMPT_BYTES_PER_TOKEN),
            asked if isinstance(asked, int) and asked > 0 else DEFAULT_MAX_TOKENS)


def costs(grid: GridParts, live: Sequence[TowerEntry], model: str, fact: tuple[int, int],
          rtts: dict[bytes, float], rates: dict[bytes, float],
          rpc_rtts: dict[bytes, float] | None = None) -> strategy.Costs:
    """The Costs of ``live`` towers for ``model`` (need MiB, layers ``fact``) as this client knows them
    (``rtts``, ``rates``, ``rpc_rtts``: the coordinator's, client/estimates.CoordinatorView)."""
    known = grid.model_facts.get(model, {})
    experts = known.get("expert_bytes", 0)
    # A tower that does not say what a token reads of the experts: the prior share of them.
    expert_read = known.get("expert_read_bytes") or int(experts * strategy.ACTIVE_EXPERTS)
    return strategy.Costs({e.destination_hash: estimates.bandwidth(grid, e, grid.served) for e in live}, rtts, rates,
                          {e.destination_hash: e.caps.hardware.backend for e in live},
                          estimates.read_bytes(grid, model, fact[0]), experts, expert_read,
                          known.get("embedding", 4096), rpc_rtts or {})


def estimated(placement: Plan, c: strategy.Costs, shape: tuple[int, int]) -> tuple[Plan, strategy.Candidate]:
    """``placement`` with its Estimate for a request of ``shape``, and its Candidate."""
    candidate = strategy.cost(placement, c, *shape)
    whole = dataclasses.replace(placement.coordinator, first=0, end=placement.n_layers)
    alone = strategy.cost(dataclasses.replace(placement, coordinator=whole, workers=(), strategy="pipeline"), c, *shape)
    where = " + ".join(placement.towers[-1:] + placement.towers[:-1])
    crossing = estimate.link_bytes_per_token(c.embedding, shape[0]) if placement.workers else 0
    return dataclasses.replace(placement, estimate=Estimate(candidate.tokens_per_s, max(
        0.0, candidate.ttft_s - alone.ttft_s), where, crossing)), candidate


def auto(place: Place, offers: list[Offer], c: strategy.Costs, shape: tuple[int, int]) -> Plan:
    """The fastest plan of every strategy ``place`` can make over ``offers``
    (experts only for a model with expert tensors). Raises PlanError when none fits."""
    candidates, refused = [], []
    for name in STRATEGIES:
        if name == "experts" and not c.expert_bytes:
            continue
        try:
            candidates.append(estimated(place(name, offers), c, shape)[1])
        except PlanError as e:
            refused.append(f"{name}: {e}")
    if not candidates:
        raise PlanError("; ".join(refused))
    best, why = strategy.pick(candidates)
    lines = [f"--split auto for a ~{shape[0]}-token prompt and {shape[1]} tokens: {why}"]
    lines += [f"estimate {k.plan.strategy}: ~{k.tokens_per_s:.1f} tokens/s, {k.ttft_s:.2f} s to the first token, "
              f"~{k.total_s:.2f} s in all" for k in candidates]
    lines += [f"not {line}" for line in refused]
    chosen, _ = estimated(best.plan, c, shape)
    return dataclasses.replace(chosen, reasons=chosen.reasons + tuple(lines))
