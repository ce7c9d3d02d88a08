"""Facts read from a GGUF file's metadata: architecture, linear modules,
vocabulary, and the memory a model needs once loaded (one read per file).

The KV-cache size follows llama.cpp's default (f16 K and V for every layer):
2 x layers x context tokens x KV heads x head dimension x 2 bytes.
"""

import dataclasses
import hashlib
import os
import threading
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import gguf

from announce.capsfull import TEXT_MAX_BYTES, ModelSummary
from reticulum_grid.store import facts_cache, gguf_header
from reticulum_grid.store.gguf_header import quantization_name
from reticulum_grid.store.names import is_gguf

#: LoRA targets llama.cpp applies and we can convert: the linear projections.
#: (Embeddings and modules_to_save would need full tensors in the adapter.)
LINEAR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MIB = 1 << 20
#: llama.cpp's compute buffers and the like on top of weights and KV cache (MiB).
RUNTIME_OVERHEAD_MIB = 128


class LoraError(ValueError):
    pass


def file_kind(path: str | os.PathLike[str]) -> str:
    """The blob kind a file most likely is: "adapter" for a GGUF whose
    general.type is "adapter" (llama.cpp's LoRA files), "model" for other GGUF
    files, "dataset" for .jsonl, else "file". Raises ValueError for a
    GGUF that cannot be read (store/gguf_header.py)."""
    if not is_gguf(path):
        return "dataset" if str(path).endswith(".jsonl") else "file"
    return "adapter" if gguf_header.read(path).adapter else "model"


@dataclass(frozen=True)
class ModelFacts:
    """What a GGUF model says of itself (its metadata; one read per file, see ``facts``)."""
    arch: str
    blocks: int
    heads: int
    kv_heads: int
    embedding: int
    context_length: int
    pooling: int  # llama.cpp's enum: 1 mean, 2 cls, 3 last, 4 rank; 0 for none
    vocabulary: str  # vocabulary_id
    modules: frozenset[str]  # LINEAR_TARGETS this model has
    experts: bool  # it has mixture-of-experts tensors (blk.N.ffn_*_exps)
    parameters: int = 0  # weights, summed over the tensors
    quantization: str | None = None  # llama.cpp's file type ("Q4_1"); None when the file or gguf does not say
    name: str | None = None  # general.name, when the file carries a showable one
    expert_bytes: int = 0  # bytes of the expert tensors (0 for a dense model)
    read_bytes: int = 0  # bytes of weights one decoded token reads (see read_per_token)
    expert_read_bytes: int = 0  # of which expert tensors' (0 for a dense model)


_facts: dict[tuple[str, int, int], ModelFacts] = {}
_facts_lock = threading.Lock()


#: The cache's name for ModelFacts' fields: a field added or renamed misses every older entry.
FACTS_FORM = "ModelFacts:" + ",".join(f.name for f in dataclasses.fields(ModelFacts))


def facts(path: str | os.PathLike[str]) -> ModelFacts:
    """The ModelFacts of the GGUF at ``path``, read once per file and kept, in
    this process and on disk for the next (store/facts_cache.py: the gguf
    library parses every field, the whole token list too, seconds for a model
    with a large vocabulary). Raises what os.stat and the gguf library raise."""
    path = str(path)
    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime_ns)
    with _facts_lock:
        found = _facts.get(key)
    if found is None:
        found = _from_cache(facts_cache.load(path, FACTS_FORM))
    if found is None:
        found = _read_facts(gguf.GGUFReader(path))
        facts_cache.save(path, FACTS_FORM, {**dataclasses.asdict(found), "modules": sorted(found.modules)})
    with _facts_lock:
        _facts[key] = found
    return found


def _from_cache(values: dict[str, Any] | None) -> ModelFacts | None:
    """The ModelFacts a cache entry holds, or None when it holds anything else."""
    if values is None or not isinstance(values.get("modules"), list):
        return None
    try:
        found = ModelFacts(**{**values, "modules": frozenset(values["modules"])})
    except TypeError:  # a missing or unknown field
        return None
    fits = all(_fits(getattr(found, f.name), f.type) for f in dataclasses.fields(ModelFacts))
    return found if fits and all(isinstance(m, str) for m in found.modules) else None


def _fits(value: Any, kind: Any) -> bool:
    origin = typing.get_origin(kind)  # frozenset[str] -> frozenset; str | None stays a union isinstance takes
    return isinstance(value, kind if origin is None or origin is types.UnionType else origin)


def _read_facts(reader: gguf.GGUFReader) -> ModelFacts:
    arch = _field(reader, "general.architecture")

    def number(key: str, default: int) -> int:
        field = reader.fields.get(f"{arch}.{key}")
        return int(field.parts[-1][0]) if field is not None else default

    blocks = number("block_count", 0)
    heads = number("attention.head_count", 1)
    used, count = number("expert_used_count", 0), number("expert_count", 0)
    read, expert_read = read_per_token(reader.tensors, used / count if used and count else 1.0)
    return ModelFacts(arch, blocks, heads, number("attention.head_count_kv", heads), number("embedding_length", 0),
                      number("context_length", 4096), number("pooling_type", 0), _vocabulary_id(reader),
                      frozenset(_modules(reader, arch, blocks)), any("_exps" in t.name for t in reader.tensors),
                      int(sum(int(t.n_elements) for t in reader.tensors)), _quantization(reader), _name(reader),
                      int(sum(int(t.n_bytes) for t in reader.tensors if "_exps" in t.name)), read, expert_read)


def read_per_token(tensors: Iterable[Any], active: float) -> tuple[int, int]:
    """(bytes of weights one decoded token reads, of which expert tensors')
    of a GGUF's ``tensors`` (gguf ReaderTensors: name, shape in ggml order,
    n_elements, n_bytes): every tensor once, but of a token embedding beside
    an output layer of its own one row (a lookup; without one, the embedding
    is also the output layer and read whole), and of expert tensors
    (``*_exps``) the ``active`` share (expert_used_count / expert_count)."""
    tensors = list(tensors)
    untied = any(t.name == "output.weight" for t in tensors)
    read = experts = 0
    for t in tensors:
        size = int(t.n_bytes)
        if t.name == "token_embd.weight" and untied:
            size = size * int(t.shape[0]) // max(int(t.n_elements), 1)
        elif "_exps" in t.name:
            size = int(size * active)
            experts += size
        read += size
    return read, experts


def _quantization(reader: gguf.GGUFReader) -> str | None:
    field = reader.fields.get("general.file_type")
    return quantization_name(field.parts[-1][0]) if field else None


def _name(reader: gguf.GGUFReader) -> str | None:
    """general.name when it is text a client can show (it travels in caps/full), else None."""
    try:
        name = _field(reader, "general.name") if "general.name" in reader.fields else None
    except UnicodeDecodeError:
        return None
    return _showable(name, TEXT_MAX_BYTES)


def _showable(text: str | None, max_bytes: int) -> str | None:
    """``text`` when it is printable and fits ``max_bytes`` (caps/full's decoder takes no other), else None."""
    return text if text is not None and text.isprintable() and len(text.encode("utf-8")) <= max_bytes else None


def _modules(reader: gguf.GGUFReader, arch: str, blocks: int) -> set[str]:
    try:
        names = name_map(arch, blocks)
    except LoraError:
        return set()
    gguf_names = {t.name.rsplit(".", 1)[0] for t in reader.tensors}
    modules = set()
    for hf_leaf in LINEAR_TARGETS:
        hf = f"model.layers.0.{_parent(hf_leaf)}.{hf_leaf}"
        mapped = names.get_name(hf + ".weight", try_suffixes=(".weight",))
        if mapped and mapped.rsplit(".", 1)[0] in gguf_names:
            modules.add(hf_leaf)
    return modules


def architecture(path: str | os.PathLike[str]) -> tuple[str, int, set[str]]:
    """(architecture name, block count, set of HF module leaf names) of a GGUF
    model. Raises LoraError for an architecture the gguf library does not know."""
    f = facts(path)
    name_map(f.arch, f.blocks)  # an unknown architecture has no LoRA modules to name
    return f.arch, f.blocks, set(f.modules)


def _parent(leaf: str) -> str:
    return "self_attn" if leaf in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"


def _field(reader: gguf.GGUFReader, key: str) -> str:
    return bytes(reader.fields[key].parts[-1]).decode("utf-8")


def name_map(arch: str, blocks: int) -> gguf.TensorNameMap:
    arch_id = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if arch_id is None:
        raise LoraError(f"the gguf library does not know architecture {arch!r}")
    return gguf.get_tensor_name_map(arch_id, blocks)




def context_length(path: str | os.PathLike[str]) -> int:
    """The context length (tokens) the GGUF at ``path`` was trained for (4096 when it does not say)."""
    return facts(path).context_length


def pooling(path: str | os.PathLike[str]) -> int:
    """The embedding pooling type a GGUF names (llama.cpp's enum: 1 mean, 2 cls, 3 last, 4 rank), 0 for none."""
    return facts(path).pooling


def vocabulary_id(path: str | os.PathLike[str]) -> str:
    """A digest of the GGUF's tokenizer: two models with the same id tokenize
    alike, so one can draft for the other (see _vocabulary_id)."""
    return facts(path).vocabulary


def _vocabulary_id(reader: gguf.GGUFReader) -> str:
    """BLAKE2 of the tokenizer's model and pre-tokenizer and its token list."""
    digest = hashlib.blake2b(digest_size=16)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
        field = reader.fields.get(key)
        digest.update((bytes(field.parts[-1]) if field is not None else b"") + b"\0")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        for i in tokens.data:
            digest.update(bytes(tokens.parts[i]) + b"\0")
    return digest.hexdigest()


def need_mib(path: str | os.PathLike[str], n_ctx: int, file_size: int) -> int:
    """Memory (MiB) the model at ``path`` needs loaded with a ``n_ctx``-token
    context (0: the model's own context length): weights (the file) + f16 KV
    cache + runtime overhead."""
    f = facts(path)
    return memory_need_mib(file_size, f.blocks, f.embedding // max(f.heads, 1), f.kv_heads,
                           n_ctx or f.context_length)


def memory_need_mib(weight_bytes: int, blocks: int, head_dim: int, kv_heads: int, n_ctx: int) -> int:
    """Memory (MiB) a model of ``weight_bytes`` (its GGUF's size) needs loaded
    with an ``n_ctx``-token f16 KV cache (see the module doc) + runtime overhead."""
    kv_bytes = 2 * blocks * n_ctx * kv_heads * head_dim * 2
    return (weight_bytes + kv_bytes) // MIB + RUNTIME_OVERHEAD_MIB


def summary(path: str | os.PathLike[str]) -> ModelSummary:
    """What a model is, for Ollama's ``/api/show`` and ``/api/tags`` (it
    travels in caps/full), from the same one read as ``facts``: architecture,
    weights, quantization, context, embedding width, blocks, pooling (0: none;
    an embedding model has one) and name. Raises what ``facts`` raises."""
    f = facts(path)
    return ModelSummary(architecture=_showable(f.arch, 64), parameters=f.parameters, quantization=f.quantization,
                        context_length=f.context_length or 4096, embedding_length=f.embedding or None,
                        block_count=f.blocks or None, pooling=f.pooling, name=f.name)
