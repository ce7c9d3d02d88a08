"""Which strategy a split request runs with (``--split auto``): each candidate
plan's cost for this request, and the fastest. Pure functions.

A request costs its time to first token (the prompt's prefill) plus
``max_tokens`` over its decode rate. Per strategy (plan.STRATEGIES):

- **pipeline**: decode as split/estimate.py (the stages in turn, round trips
  per remote stage); prefill runs the stages in turn too, plus the prompt's
  activations over each worker's link.
- **experts**: the coordinator reads what a token reads of all but the
  experts, a worker what it reads of the experts it holds (the share a token
  runs: Costs.expert_read_bytes); every layer whose
  experts sit on a worker costs EXPERT_CROSSING_S plus EXPERT_ROUND_TRIPS RPC
  round trips to it (the way its RPC bytes go, as the coordinator timed it at
  its last load there; before any, EXPERT_PING_ROUND_TRIPS of its RNS ping's
  round trip) and its hidden state both ways. Prefill is the pipeline's, with
  those crossings per layer.
- **tensor**: the towers read their shares at once (the slowest sets the
  pace) and every layer synchronises SYNCS_PER_LAYER times, each costing
  TENSOR_SYNC_S plus TENSOR_SYNC_ROUND_TRIPS RPC round trips to the farthest
  worker (tensor_sync_s: as timed at its last load; before any, the ping's
  TENSOR_PING_* fallback) and the hidden state of every token in flight over
  the slowest link; prefill computes on all towers at once at
  TENSOR_EFFICIENCY of their summed rates.

Bytes read are a token's (store/gguf_info.read_per_token), the bandwidths
measured decode rates times those (client/estimates.py). A tower prefills
PREFILL_PER_DECODE[backend] times as many tokens a second as it decodes. The constants come from measurements (their comments say which);
bench/split.py --strategy checks the estimates against what runs.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from reticulum_grid.split import estimate
from reticulum_grid.split.plan import Plan

#: Prompt tokens a second per decoded token a second (prior per backend). CPU, measured: SmolLM2-135M with one
#: thread prefilled a 1k-token prompt at 213 tokens/s and decoded at 67.4 (issue 32's loopback run).
PREFILL_PER_DECODE = {"cpu": 3.2, "cuda": 60.0, "rocm": 50.0, "metal": 20.0, "vulkan": 30.0, "sycl": 30.0}
#: Share of an MoE layer's experts a token runs where a tower does not say (caps/full expert_read_bytes; top-2 of 8).
ACTIVE_EXPERTS = 0.25
#: What a layer whose experts a worker holds costs beyond the compute and the hidden state's bytes: a fixed
#: EXPERT_CROSSING_S (llama.cpp's own hand-over to the RPC server and back, which no link has: its raw split on
#: loopback, no relay between, took 0.67 ms a layer more than one process) plus EXPERT_ROUND_TRIPS of the RPC round
#: trip the coordinator timed the way the bytes go (split/probe.py rpc_rtts: llama.cpp's commands pass both
#: data-plane relays and, on the lab's LAN, its shaping bridge, whose frames a busy machine wakes late). A least-
#: squares fit to four runs of bench/split.py --strategy experts (a Qwen3-MoE shape of 8 layers all on one worker,
#: the compute taken as the single tower's decode time; load averages 2 to 7): 1.00 and 1.27 ms a layer at RPC
#: round trips of 0.12 and 0.18 ms on loopback, 3.47 and 4.10 ms at 1.64 and 1.53 ms on the LAN, each within 12 %
#: of the fit (the RNS ping said 0.97, 0.91, 1.95 and 2.79 ms: it crosses RNS, not the relays).
EXPERT_CROSSING_S = 0.9e-3
EXPERT_ROUND_TRIPS = 1.8
#: Where the coordinator has timed no RPC round trip to a worker yet (no split model loaded there), a layer costs
#: this many of its RNS ping's round trips instead: the median of eight earlier runs (loopback and LAN, load
#: averages 1-9; 0.7 to 2.3 in single runs, 1.0 to 1.8 in the four above). The ping's round trip swings with
#: load more than a crossing does (1.57 to 2.79 ms over four LAN runs whose crossings took 3.5 to 4.2 ms): that
#: swing put one LAN estimate 0.711 off.
EXPERT_PING_ROUND_TRIPS = 1.3
#: Synchronisations per layer in tensor split mode (after attention, after the feed-forward network).
SYNCS_PER_LAYER = 2
#: One synchronisation between RPC devices costs TENSOR_SYNC_S, TENSOR_SYNC_ROUND_TRIPS of the RPC round trip the
#: coordinator timed to the worker (split/probe.py rpc_rtts: the meta device reads each device's partial result and
#: writes the sum back, command by command, through both data-plane relays) and the hidden state's bytes. Fitted
#: (the largest estimate error made least) to three runs of bench/split.py --strategy tensor (SmolLM2-135M, 30
#: layers, 2 syncs each, one thread per device, data plane, load averages 2.3 to 5.9), a sync's cost being the
#: split's time per token beyond one tower's over 60: loopback 3.13 ms at an RPC round trip of 0.139 ms (llama.cpp's
#: own split, no relay, 2.79 ms: most of it is the CPU's, not the link's); the lab's LAN 26.4 ms at 1.39 ms and 24.5
#: at 2.21 (a check since: 22.6 ms at 1.29, 0.147 off). On the LAN the cost does not follow the round trip (the
#: faster ones cost more) nor the ping (1.67-2.90 ms): it stayed 23-26 ms a sync, so the line only tells loopback
#: from the LAN (+0.26 and -0.25 off in the fitted LAN runs). What it follows is bytes: the lab bridge's counters
#: showed ~16 MB/s coordinator to worker all through a LAN decode, ~22-26 MB a token, about the bundled model's
#: tied token embedding (30.1 MB, Q8_0) each token, so a token costs about that over the link's throughput.
TENSOR_SYNC_S = 1.2e-3
TENSOR_SYNC_ROUND_TRIPS = 14.0
#: Where the coordinator has timed no RPC round trip to a worker yet, a sync costs TENSOR_PING_SYNC_S plus
#: TENSOR_PING_ROUND_TRIPS of its RNS ping's round trip less PROBE_OVERHEAD_S, what the probe adds over a TCP round
#: trip (0.33 ms on loopback, where TCP takes well under 0.05). Fitted earlier on a quieter machine: loopback
#: 65.9-72.7 ms a token against 6.0-6.6 in one process (~1.1 ms a sync at a 0.33 ms probe RTT), the LAN (1.1 ms)
#: 464 ms (7.7 ms a sync); within 0.04 in two busier runs since (loopback 0.035, LAN 0.003) but 0.664 off in a
#: third (LAN, ping 1.96 ms, 24.5 ms a sync). (Two bare ggml-rpc-servers on another machine: 1.7 ms a sync.)
PROBE_OVERHEAD_S = 0.3e-3
TENSOR_PING_SYNC_S = 0.9e-3
TENSOR_PING_ROUND_TRIPS = 8.0
#: What tensor-parallel prefill keeps of the towers' summed prefill rates (the bare RPC servers' run: a 1k-token prompt in
#: 3.5 s against 4.7 s in one process, the synchronisations above taken out).
TENSOR_EFFICIENCY = 0.75
#: How much faster (total time) another strategy must be estimated than the pipeline to be picked: the
#: pipeline alone lets workers seed their tensor caches from their own copies (tower/shard.py), it is
#: llama.cpp's stable mode (tensor is EXPERIMENTAL, and its sums in another order can change a token where
#: two are nearly tied), and estimates err by up to 30 %.
AUTO_MARGIN = 1.2
#: Tokens llama.cpp prefills in one batch (its default n_ubatch): each costs its own synchronisations.
UBATCH = 512


@dataclass(frozen=True)
class Costs:
    """What the towers of a request's candidate plans offer, by destination
    hash: ``bandwidths`` (bytes/s of weights), ``rtts`` (s, coordinator to
    worker), ``rates`` (bytes/s of each worker's link; estimate.PRIOR_LINK_RATE
    where missing), ``backends`` ("cpu", "cuda", ...); the model's
    ``read_bytes`` (what one decoded token reads of its weights), ``expert_bytes``
    (its expert tensors; 0 for a dense model), ``expert_read_bytes`` (what a token
    reads of those) and ``embedding`` width; ``rpc_rtts`` (s, coordinator to
    worker: an RPC command's round trip the way the split's bytes go, split/probe.py;
    where missing, expert_crossing_s and tensor_sync_s fall back on ``rtts``)."""
    bandwidths: Mapping[bytes, float]
    rtts: Mapping[bytes, float]
    rates: Mapping[bytes, float]
    backends: Mapping[bytes, str]
    read_bytes: int
    expert_bytes: int
    expert_read_bytes: int
    embedding: int
    rpc_rtts: Mapping[bytes, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Candidate:
    """One strategy's plan for a request: ``tokens_per_s`` decoding, ``ttft_s``
    (the prompt's prefill and its crossings), ``total_s`` for the whole request."""
    plan: Plan
    tokens_per_s: float
    ttft_s: float
    total_s: float

    def to_map(self) -> dict[str, object]:
        return {"strategy": self.plan.strategy, "towers": self.plan.towers, "tokens_per_s": round(self.tokens_per_s, 2),
                "ttft_s": round(self.ttft_s, 3), "total_s": round(self.total_s, 3)}


def cost(placement: Plan, c: Costs, prompt_tokens: int, max_tokens: int) -> Candidate:
    """The Candidate of ``placement`` for a request of ``prompt_tokens`` and ``max_tokens``."""
    per_token, prefill = {"experts": _experts, "tensor": _tensor}.get(placement.strategy, _pipeline)(
        placement, c, max(prompt_tokens, 1))
    return Candidate(placement, 1.0 / per_token, prefill, prefill + max_tokens * per_token)


def pick(candidates: list[Candidate]) -> tuple[Candidate, str]:
    """The fastest candidate for its request (the pipeline unless another is
    AUTO_MARGIN times faster) and why, in words. Raises IndexError on none."""
    ranked = sorted(candidates, key=lambda k: k.total_s)
    best, note = ranked[0], ""
    pipeline = next((k for k in ranked if k.plan.strategy == "pipeline"), None)
    if pipeline is not None and best is not pipeline and best.total_s * AUTO_MARGIN > pipeline.total_s:
        note = f" ({best.plan.strategy} is estimated less than {AUTO_MARGIN - 1:.0%} faster)"
        best = pipeline
    why = f"{best.plan.strategy}: ~{best.total_s:.2f} s for the request " \
          f"({best.ttft_s:.2f} s to the first token, ~{best.tokens_per_s:.1f} tokens/s){note}"
    others = [k for k in ranked if k is not best]
    if others:
        why += "; " + ", ".join(f"{k.plan.strategy} ~{k.total_s:.2f} s" for k in others)
    return best, why


def _prefill_rate(c: Costs, key: bytes, share_bytes: float) -> float:
    """Prompt tokens/s the tower ``key`` prefills a part of ``share_bytes`` at."""
    decode = c.bandwidths[key] / max(share_bytes, 1.0)
    return decode * PREFILL_PER_DECODE.get(c.backends.get(key, "cpu"), PREFILL_PER_DECODE["cpu"])


def _rate(c: Costs, key: bytes) -> float:
    return c.rates.get(key, estimate.PRIOR_LINK_RATE)


def _pipeline(placement: Plan, c: Costs, prompt: int) -> tuple[float, float]:
    cost = estimate.split(placement, c.read_bytes, dict(c.bandwidths), dict(c.rtts), c.embedding, dict(c.rates),
                          prompt)
    n = max(placement.n_layers, 1)
    prefill = sum(prompt / _prefill_rate(c, p.offer.key, c.read_bytes * p.layers / n) for p in placement.parts)
    return 1.0 / cost.tokens_per_s, prefill + cost.added_ttft_s


def _experts(placement: Plan, c: Costs, prompt: int) -> tuple[float, float]:
    n = max(placement.n_layers, 1)
    rest = c.read_bytes - c.expert_read_bytes
    coordinator = placement.coordinator.offer.key
    per_token = rest / c.bandwidths[coordinator]
    prefill = prompt / _prefill_rate(c, coordinator, rest)
    total = sum(p.layers for p in placement.workers) or 1
    for part in placement.workers:
        key, layers = part.offer.key, n * part.layers / total  # its share of the expert layers
        read = c.expert_read_bytes * layers / n
        crossing = 2 * c.embedding * 4 / _rate(c, key)
        hand_over = expert_crossing_s(c, key)
        per_token += read / c.bandwidths[key] + layers * (hand_over + crossing)
        prefill += prompt / _prefill_rate(c, key, read) + layers * (hand_over + prompt * crossing)
    return per_token, prefill


def expert_crossing_s(c: Costs, key: bytes) -> float:
    """Seconds a layer whose experts worker ``key`` holds costs beyond its compute and bytes: EXPERT_CROSSING_S
    plus EXPERT_ROUND_TRIPS of the RPC round trip the coordinator timed to it, else (none timed yet)
    EXPERT_PING_ROUND_TRIPS of its RNS ping's round trip (0 where neither is known)."""
    timed = c.rpc_rtts.get(key)
    if timed:
        return EXPERT_CROSSING_S + EXPERT_ROUND_TRIPS * timed
    return EXPERT_PING_ROUND_TRIPS * c.rtts.get(key, 0.0)


def _tensor(placement: Plan, c: Costs, prompt: int) -> tuple[float, float]:
    n = max(placement.n_layers, 1)
    shares = {p.offer.key: c.read_bytes * p.layers / n for p in placement.parts}
    workers = [p.offer.key for p in placement.workers]
    sync = max((tensor_sync_s(c, k) for k in workers), default=0.0)
    slowest = min((_rate(c, k) for k in workers), default=float("inf"))
    syncs = SYNCS_PER_LAYER * n if workers else 0
    state = c.embedding * 4 * 2  # one token's hidden state, out and back
    per_token = max(share / c.bandwidths[k] for k, share in shares.items()) + syncs * (sync + state / slowest)
    summed = sum(_prefill_rate(c, k, c.read_bytes) for k in shares) * TENSOR_EFFICIENCY
    batches = -(-prompt // UBATCH)
    prefill = prompt / summed + syncs * (batches * sync + prompt * state / slowest)
    return per_token, prefill


def tensor_sync_s(c: Costs, key: bytes) -> float:
    """Seconds one tensor synchronisation with worker ``key`` costs beyond the hidden state's bytes:
    TENSOR_SYNC_S plus TENSOR_SYNC_ROUND_TRIPS of the RPC round trip the coordinator timed to it, else (none
    timed yet) TENSOR_PING_SYNC_S plus TENSOR_PING_ROUND_TRIPS of its RNS ping's round trip less
    PROBE_OVERHEAD_S (TENSOR_PING_SYNC_S alone where neither is known)."""
    timed = c.rpc_rtts.get(key)
    if timed:
        return TENSOR_SYNC_S + TENSOR_SYNC_ROUND_TRIPS * timed
    return TENSOR_PING_SYNC_S + TENSOR_PING_ROUND_TRIPS * max(0.0, c.rtts.get(key, 0.0) - PROBE_OVERHEAD_S)
