"""A model's size as the planner sees it, without the model: from a GGUF's
metadata, or a built-in shape of a published architecture (SHAPES).

Built-in shapes follow Meta's published configs on Hugging Face
(meta-llama/Meta-Llama-3-70B and meta-llama/Meta-Llama-3-8B, config.json:
num_hidden_layers, hidden_size, intermediate_size, num_attention_heads,
num_key_value_heads, vocab_size, tie_word_embeddings false). Q4_K_M weighs
4.8944 bits per weight: llama.cpp's tools/quantize/README.md (its
Llama-3.1-8B table); the same README gives 4.9 GB and 43.1 GB for the 8B and
70B Q4_K_M files, which these shapes reproduce (4.91e9 and 43.16e9 bytes).
"""

import os
from dataclasses import dataclass

from reticulum_grid.store import gguf_info

#: Bits per weight of llama.cpp's Q4_K_M (see the module doc).
Q4_K_M_BITS = 4.8944


@dataclass(frozen=True)
class Shape:
    """``blocks``: repeating layers; ``embedding``: hidden width; ``heads``
    and ``kv_heads``: attention heads (grouped-query); ``weight_bytes``: the
    GGUF's size (bytes); ``context_length``: tokens it was trained for."""
    name: str
    blocks: int
    embedding: int
    heads: int
    kv_heads: int
    weight_bytes: int
    context_length: int

    def need_mib(self, n_ctx: int) -> int:
        """Memory (MiB) it needs loaded with an ``n_ctx``-token context, as a tower counts it (gguf_info)."""
        return gguf_info.memory_need_mib(self.weight_bytes, self.blocks, self.embedding // self.heads,
                                         self.kv_heads, n_ctx)


def llama_weights(blocks: int, embedding: int, ffn: int, heads: int, kv_heads: int, vocab: int) -> int:
    """Weights of a Llama-architecture model with untied input and output
    embeddings: per block the q, k, v, o projections, the gate, up and down
    projections and two norms; then both embeddings and the final norm."""
    kv_width = embedding // heads * kv_heads
    block = 2 * embedding * embedding + 2 * embedding * kv_width + 3 * embedding * ffn + 2 * embedding
    return blocks * block + 2 * vocab * embedding + embedding


def _llama(name: str, blocks: int, embedding: int, ffn: int, heads: int, kv_heads: int) -> Shape:
    weights = llama_weights(blocks, embedding, ffn, heads, kv_heads, 128256)
    return Shape(name, blocks, embedding, heads, kv_heads, int(weights * Q4_K_M_BITS / 8), 8192)


#: Built-in shapes by name (see the module doc for every figure's source).
SHAPES = {s.name: s for s in (_llama("llama-70b-q4_k_m", 80, 8192, 28672, 64, 8),
                              _llama("llama-8b-q4_k_m", 32, 4096, 14336, 32, 8))}


def from_gguf(path: str | os.PathLike[str]) -> Shape:
    """The Shape of the GGUF model at ``path`` (its metadata and file size).
    Raises OSError for a missing file, ValueError for one the gguf library cannot read."""
    f = gguf_info.facts(path)
    if f.blocks < 1 or f.embedding < 1:
        raise ValueError(f"{os.fspath(path)} names no layers or embedding width: not a model GGUF")
    return Shape(f.name or os.path.basename(path), f.blocks, f.embedding, f.heads, f.kv_heads,
                 os.path.getsize(path), f.context_length)
