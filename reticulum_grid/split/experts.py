"""Expert placement for mixture-of-experts GGUF models.

An MoE layer's expert tensors (``blk.N.ffn_{gate,up,down}_exps``) are most of
its weights but only a few experts run per token. With expert placement the
expert tensors go to the worker towers (llama.cpp tensor buffer-type
overrides: a regex per worker naming its layers) and everything else, with
the attention and the output layer, stays on the coordinator.
"""

import os
from collections.abc import Sequence

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
