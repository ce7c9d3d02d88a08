"""What running a model costs before it runs: tokens/s and the time added to the first token,
split over towers (a Plan) or whole on one tower. Pure functions.

A decode step reads its weights once (one row of a token embedding that has
an output layer beside it, the experts a token runs: store/gguf_info.py
read_per_token), so a stage's time per token is its share of those bytes over
the memory bandwidth of the tower that holds it; a tower's bandwidth is its
measured tokens/s times the bytes a token reads of the model it serves
(client/estimates.py), else a prior for its backend (PRIOR_BANDWIDTH). llama.cpp's
RPC client waits for each reply, so every remote stage adds about
ROUND_TRIPS_PER_STAGE round trips between the coordinator and that worker
per token (measured: 117.7 ms a token against 23.4 alone at 40 ms RTT with
one worker is ~2.4; a draft model on the coordinator lets one round trip
verify several tokens). Before the first token, each remote stage also moves
the prompt's activations (prompt tokens x embedding width x 4 bytes) there
and back at the link's rate, and every generated token moves
``link_bytes_per_token`` over each worker's link, also at the link's rate.

Figures are estimates for ranking and for telling a user when splitting is
slower than not splitting; bench/split.py measures the real ones.
"""

from reticulum_grid.split.plan import Estimate, Plan  # noqa: F401 (Estimate: what this module's functions give)

#: Round trips per generated token per remote stage (see the module doc).
ROUND_TRIPS_PER_STAGE = 2.4
#: Memory bandwidth a backend reads weights at when a tower measured nothing yet (bytes/s).
PRIOR_BANDWIDTH = {"cpu": 10e9, "cuda": 500e9, "rocm": 400e9, "metal": 100e9, "vulkan": 150e9, "sycl": 150e9}
#: A link's rate when none was measured (bytes/s): a 100 Mbit/s tailnet.
PRIOR_LINK_RATE = 12.5e6
#: Bounds on any tower's bandwidth figure (bytes/s): a self-reported rate is a prior, never more.
MIN_BANDWIDTH, MAX_BANDWIDTH = 1e8, 5e12
#: The prompt a TTFT estimate is made for (tokens).
PROMPT_TOKENS = 100
#: What one generated token moves over a worker's link once llama.cpp reuses
#: its decode graph (ggml-rpc.cpp: RPC_CMD_GRAPH_RECOMPUTE instead of the whole
#: graph), read from the RPC stream by bench/split_link_bytes.py: seven
#: set_tensor messages of 314 bytes plus data (the hidden state as two f32
#: tensors, the residual's halves; the positions, the K and V row indices and
#: the output ids, 24 bytes together; the attention mask), a 13-byte recompute,
#: and a 321-byte get_tensor whose 8-byte-framed answer is the hidden state.
#: (Measured with a CPU coordinator, whose worker holds the last layers; a
#: worker holding the first ones may get the hidden state as one tensor.)
HIDDEN_STATES_PER_TOKEN = 3
RPC_FIXED_BYTES_PER_TOKEN = 7 * 314 + 24 + 13 + 321 + 8
#: The attention mask: f16 per KV cell in use (flash attention, llama.cpp's
#: default where the backend has it), cells padded to KV_CELL_PAD (llama-kv-cache.cpp).
MASK_BYTES_PER_CELL = 2
KV_CELL_PAD = 256


def bandwidth(backend: str, measured: float = 0.0) -> float:
    """Bytes/s a tower reads weights at: ``measured`` (its tokens/s times the
    bytes a token reads of the model it ran), else its backend's prior;
    clamped to what machines do."""
    value = measured if measured > 0 else PRIOR_BANDWIDTH.get(backend, PRIOR_BANDWIDTH["cpu"])
    return min(max(value, MIN_BANDWIDTH), MAX_BANDWIDTH)


def whole(read_bytes: int, tower_bandwidth: float, name: str) -> Estimate:
    """The Estimate for the model (of which a token reads ``read_bytes``) on one tower."""
    return Estimate(tower_bandwidth / max(read_bytes, 1), 0.0, name)


def link_bytes_per_token(embedding: int, context_tokens: int) -> int:
    """Bytes one worker's link carries per generated token, both ways (see
    HIDDEN_STATES_PER_TOKEN): the hidden state (``embedding`` x 4 bytes) three
    times, the mask over the KV cells in use (``context_tokens`` rounded up to
    KV_CELL_PAD) and the RPC messages' own bytes. Measured on SmolLM2-135M
    (bench/split_link_bytes.py): 9,988 bytes a token, this figure exactly."""
    cells = -(-max(context_tokens, 1) // KV_CELL_PAD) * KV_CELL_PAD
    return HIDDEN_STATES_PER_TOKEN * embedding * 4 + cells * MASK_BYTES_PER_CELL + RPC_FIXED_BYTES_PER_TOKEN


def split(placement: "Plan", read_bytes: int, bandwidths: dict[bytes, float], rtts: dict[bytes, float],
          embedding: int, rates: dict[bytes, float] | None = None, prompt_tokens: int = PROMPT_TOKENS) -> Estimate:
    """The Estimate for ``placement`` (a plan.Plan) of a model of which a
    token reads ``read_bytes``. ``bandwidths``: {tower key:
    bytes/s}; ``rtts``: {worker key: seconds between the coordinator and it};
    ``embedding``: the model's width; ``rates``: {worker key: bytes/s of its
    link} (PRIOR_LINK_RATE where missing)."""
    rates = rates or {}
    n_layers = max(placement.n_layers, 1)
    per_token = sum(read_bytes * p.layers / n_layers / bandwidths[p.offer.key] for p in placement.parts)
    workers = [p.offer.key for p in placement.workers]
    crossing = link_bytes_per_token(embedding, prompt_tokens) if workers else 0
    per_token += sum(ROUND_TRIPS_PER_STAGE * rtts.get(k, 0.0) + crossing / rates.get(k, PRIOR_LINK_RATE)
                     for k in workers)
    activations = 2 * prompt_tokens * embedding * 4
    added = sum(ROUND_TRIPS_PER_STAGE * rtts.get(k, 0.0) + activations / rates.get(k, PRIOR_LINK_RATE)
                for k in workers)
    return Estimate(1.0 / per_token, added, " + ".join(placement.towers[-1:] + placement.towers[:-1]), crossing)
