"""Facts read from a GGUF file's metadata: architecture, linear modules,
and the memory a model needs once loaded.

The KV-cache size follows llama.cpp's default (f16 K and V for every layer):
2 x layers x context tokens x KV heads x head dimension x 2 bytes.
"""

import gguf

from reticulum_grid.store.names import is_gguf

#: LoRA targets llama.cpp applies and we can convert: the linear projections.
#: (Embeddings and modules_to_save would need full tensors in the adapter.)
LINEAR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MIB = 1 << 20
#: llama.cpp's compute buffers and the like on top of weights and KV cache (MiB).
RUNTIME_OVERHEAD_MIB = 128


class LoraError(ValueError):
    pass


def file_kind(path):
    """The blob kind a file most likely is: "adapter" for a GGUF whose
    general.type is "adapter" (llama.cpp's LoRA files), "model" for other GGUF
    files, "dataset" for .jsonl, else "file"."""
    if not is_gguf(path):
        return "dataset" if str(path).endswith(".jsonl") else "file"
    field = gguf.GGUFReader(path).fields.get("general.type")
    return "adapter" if field is not None and bytes(field.parts[-1]) == b"adapter" else "model"


def architecture(path):
    """(architecture name, block count, set of HF module leaf names) of a GGUF model."""
    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    blocks = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    names = name_map(arch, blocks)
    gguf_names = {t.name.rsplit(".", 1)[0] for t in reader.tensors}
    modules = set()
    for hf_leaf in LINEAR_TARGETS:
        hf = f"model.layers.0.{_parent(hf_leaf)}.{hf_leaf}"
        mapped = names.get_name(hf + ".weight", try_suffixes=(".weight",))
        if mapped and mapped.rsplit(".", 1)[0] in gguf_names:
            modules.add(hf_leaf)
    return arch, blocks, modules


def _parent(leaf):
    return "self_attn" if leaf in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"


def _field(reader, key):
    return bytes(reader.fields[key].parts[-1]).decode("utf-8")


def name_map(arch, blocks):
    arch_id = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if arch_id is None:
        raise LoraError(f"the gguf library does not know architecture {arch!r}")
    return gguf.get_tensor_name_map(arch_id, blocks)




def context_length(path):
    """The context length (tokens) the GGUF at ``path`` was trained for (4096 when it does not say)."""
    reader = gguf.GGUFReader(path)
    field = reader.fields.get(f"{_field(reader, 'general.architecture')}.context_length")
    return int(field.parts[-1][0]) if field is not None else 4096


def pooling(path):
    """The embedding pooling type a GGUF names (llama.cpp's enum: 1 mean, 2 cls, 3 last, 4 rank), 0 for none."""
    reader = gguf.GGUFReader(path)
    field = reader.fields.get(f"{_field(reader, 'general.architecture')}.pooling_type")
    return int(field.parts[-1][0]) if field is not None else 0


def need_mib(path, n_ctx, file_size):
    """Memory (MiB) the model at ``path`` needs loaded with a ``n_ctx``-token
    context (0: the model's own context length): weights (the file) + f16 KV
    cache + runtime overhead."""
    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")

    def number(key, default):
        field = reader.fields.get(f"{arch}.{key}")
        return int(field.parts[-1][0]) if field is not None else default

    layers = number("block_count", 0)
    heads = number("attention.head_count", 1)
    kv_heads = number("attention.head_count_kv", heads)
    head_dim = number("embedding_length", 0) // max(heads, 1)
    n_ctx = n_ctx or number("context_length", 4096)
    kv_bytes = 2 * layers * n_ctx * kv_heads * head_dim * 2
    return (file_size + kv_bytes) // MIB + RUNTIME_OVERHEAD_MIB


def summary(path):
    """What a model is, from its GGUF metadata (for Ollama's ``/api/show`` and
    ``/api/tags``): ``{"architecture": str, "parameters": int (weights, summed
    over the tensors), "quantization": str (llama.cpp's file type, e.g.
    "Q4_1"), "context_length": tokens, "embedding_length": int, "block_count":
    int, "pooling": llama.cpp's pooling enum (0: none; an embedding model has one),
    "name": str}``. Keys the file does not carry are left out (the name, the
    file type)."""
    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")

    def number(key):
        field = reader.fields.get(key)
        return int(field.parts[-1][0]) if field is not None else None

    facts = {"architecture": arch, "parameters": int(sum(int(t.n_elements) for t in reader.tensors)),
             "context_length": number(f"{arch}.context_length") or 4096,
             "embedding_length": number(f"{arch}.embedding_length"), "block_count": number(f"{arch}.block_count"),
             "pooling": number(f"{arch}.pooling_type") or 0}
    file_type = number("general.file_type")
    if file_type is not None:
        try:
            facts["quantization"] = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:  # a file type this gguf library does not know yet
            pass
    if "general.name" in reader.fields:
        facts["name"] = _field(reader, "general.name")
    return {k: v for k, v in facts.items() if v is not None}
