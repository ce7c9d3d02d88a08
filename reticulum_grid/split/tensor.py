"""Tensor parallelism: every layer's weights split across all towers of a plan
(llama.cpp's ``--split-mode tensor``, EXPERIMENTAL in the vendored source).

llama.cpp makes one "meta" device of the devices it is given; each holds its
share of every weight matrix and of the KV cache, and all of them compute
each layer at once, synchronising several times a layer (src/llama.cpp
llama_prepare_model_devices; flash attention is required, llama.cpp turns it
on). Only non-CPU devices join, so a CPU coordinator's own share runs in its
own ``ggml-rpc-server`` (tower/split.py lends it to itself through a loopback
data-plane front); a GPU coordinator's runs on its GPU. Shares follow the
memory each tower lends (``--tensor-split``), in the order ``devices`` names.

Some architectures are refused (``llm_arch_supports_sm_tensor`` in
src/llama-arch.cpp: OLMoE, DeepSeek-2, Mamba, ...); llama.cpp's load error
names the architecture and ``refused_architecture`` reads it back, so the
coordinator answers ``unsupported`` naming it instead of a bare load failure.

Measured on loopback (two RPC servers, one thread each, SmolLM2-135M): the
same text as one process, decode at 0.136x of one process (many small
synchronisations a token) but a 1k-token prompt 1.36x faster (both compute
at once): it pays where prompts are long and links fast.
"""

import dataclasses
import re
from collections.abc import Iterable, Sequence

from reticulum_grid.split.plan import HEADROOM, Offer, Plan, plan

_REFUSED = re.compile(r"LLAMA_SPLIT_MODE_TENSOR not implemented for architecture '([^']{1,64})'")


def plan_tensor(offers: Iterable[Offer], need_mib: int, n_layers: int, headroom: float = HEADROOM) -> Plan:
    """The tensor-parallel plan for a model needing ``need_mib`` MiB: the same
    towers a pipeline would take (the fewest that hold it, preferred first),
    each holding a share of every layer in proportion to what it lends (the
    parts' layer counts are those shares). Raises PlanError."""
    base = plan(offers, need_mib, n_layers, headroom)
    shares = ", ".join(f"{p.offer.name} {p.layers}/{n_layers}" for p in base.parts)
    reasons = (base.reasons[0], f"tensor parallel: every layer's weights across {len(base.parts)} tower(s), "
                                f"shares by lent memory ({shares})",
               f"coordinator {base.coordinator.offer.name}: lends the most, runs the model's server")
    return dataclasses.replace(base, reasons=reasons, strategy="tensor")


def devices(endpoints: Sequence[str], gpu: str) -> tuple[str, ...]:
    """llama.cpp's device names for a tensor split over the RPC ``endpoints``
    (in ``--rpc`` order; ggml-rpc names them RPC0, RPC1, ...) and this
    tower's ``gpu`` ("CUDA0"; "" on a CPU tower, whose share is an endpoint)."""
    return tuple(f"RPC{i}" for i in range(len(endpoints))) + ((gpu,) if gpu else ())


def refused_architecture(message: str) -> str | None:
    """The architecture llama.cpp's load error ``message`` says tensor split mode refuses, or None."""
    found = _REFUSED.search(message)
    return found.group(1) if found else None
