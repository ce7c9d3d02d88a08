"""Tiny GGUF models written on the spot with the gguf library (no hub): random
f32 weights, the real tokenizer of the bundled model, so any runner loads them
and their vocabulary matches SmolLM2's (a draft for speculative decoding, a
mixture of experts for expert placement: llama's own, or the Qwen3-MoE and
OLMoE architectures as llama.cpp's src/models/qwen3moe.cpp and olmoe.cpp read them)."""

import shutil

import gguf
import numpy as np


#: Architectures with per-layer query and key norms (RMS over each head for Qwen3-MoE, over the whole width for OLMoE).
QK_NORM = {"qwen3moe": "head", "olmoe": "width"}


def write_tiny(path, tokenizer_source, layers=2, dim=64, ff=128, heads=4, experts=0, seed=7, arch="llama"):
    """A GGUF of architecture ``arch`` ("llama", "qwen3moe" or "olmoe": the
    last two need ``experts``) with ``layers`` blocks of width ``dim``;
    ``experts`` > 0 gives each layer that many experts (2 used, each ``ff``
    wide) instead of one feed-forward network. Beside llama (whose output is
    the token embedding) the file has an output layer whose rows of the
    control tokens are zero, so greedy text never ends early."""
    src = gguf.GGUFReader(tokenizer_source)
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(dim // heads)
    w.add_layer_norm_rms_eps(1e-5)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
        if arch == "qwen3moe":
            w.add_expert_feed_forward_length(ff)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, field in src.fields.items():
        if key.startswith("tokenizer.ggml.") or key == "tokenizer.chat_template":
            value = field.contents()
            sub = field.types[1] if len(field.types) > 1 else None
            w.add_key_value(key, value, field.types[0], sub_type=sub)
    rng = np.random.default_rng(seed)

    def tensor(name, *shape, scale=0.2):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    tensor("token_embd.weight", vocab, dim, scale=1.0)
    tensor("output_norm.weight", dim)
    if arch != "llama":
        output = (rng.standard_normal((vocab, dim)) * 0.2).astype(np.float32)
        types = src.fields["tokenizer.ggml.token_type"].contents()
        output[[i for i, t in enumerate(types) if t != 1]] = 0.0
        w.add_tensor("output.weight", output)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", dim)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"blk.{i}.{name}.weight", dim, dim)
        if arch in QK_NORM:
            width = dim // heads if QK_NORM[arch] == "head" else dim
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(width, dtype=np.float32))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(width, dtype=np.float32))
        tensor(f"blk.{i}.ffn_norm.weight", dim)
        if experts:
            tensor(f"blk.{i}.ffn_gate_inp.weight", experts, dim)
            tensor(f"blk.{i}.ffn_gate_exps.weight", experts, ff, dim)
            tensor(f"blk.{i}.ffn_up_exps.weight", experts, ff, dim)
            tensor(f"blk.{i}.ffn_down_exps.weight", experts, dim, ff)
        else:
            tensor(f"blk.{i}.ffn_gate.weight", ff, dim)
            tensor(f"blk.{i}.ffn_up.weight", ff, dim)
            tensor(f"blk.{i}.ffn_down.weight", dim, ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def renamed_copy(path, out):
    """``path``'s GGUF with one letter of its general.name changed: the same
    weights as another blob (a draft that agrees with its model)."""
    shutil.copy(path, out)
    with open(out, "r+b") as f:
        head = f.read(1 << 16)
        key = head.index(b"general.name")
        value = key + len(b"general.name") + 4 + 8  # the value's type (u32), then its length (u64)
        f.seek(value)
        first = f.read(1)
        f.seek(value)
        f.write(b"X" if first != b"X" else b"Y")
    return out


def truncated_copy(path, out, layers):
    """``path``'s GGUF with only its first ``layers`` blocks (the same
    embeddings, output layer and tokenizer): a smaller model of the same
    family that still agrees with the whole one on many tokens, a realistic
    draft for speculative decoding."""
    reader = gguf.GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode("utf-8")
    w = gguf.GGUFWriter(str(out), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == f"{arch}.block_count":
            w.add_uint32(key, layers)
            continue
        sub = field.types[1] if len(field.types) > 1 else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers:
            continue
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)  # quantized data comes byte-shaped
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
