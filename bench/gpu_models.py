"""Random-weight GGUF models of real shapes, written on the spot with the gguf library.

A machine with no network gets no model (the bundled one alone is larger than
what may travel), so the GPU check writes its own: a llama-architecture GGUF
shaped like Llama-3-8B (32 layers of width 4096, 8 KV heads, 128256-token
vocabulary; Q8_0, 8.5 GB) and one shaped like the bundled SmolLM2-135M (F16),
both speaking the bundled model's tokenizer (the pack's ``tokenizer.gguf``;
the 8B's vocabulary is padded with unreachable ``<pad_N>`` tokens up to
128256). llama.cpp loads and runs them like any model of those shapes, and
transformers reads the small one as it reads any GGUF; the text they produce
means nothing, the speed is the real one.

Writing is fast: each tensor is one small random block (a prime number of
quantization blocks, so rows differ) repeated, streamed tensor by tensor. The
output rows of every control token (end of text and the chat markers) are
zero, so those logits stay at 0 while the largest of the others is positive:
a stream at temperature 0 runs to ``max_tokens`` without hitting an end.

For training, ``--checkpoint`` also builds the small shape as a transformers
model from its config (torch's random initialisation) and saves it as a
safetensors checkpoint folder with the same tokenizer (``write_checkpoint``).

``python -m bench.gpu_models --tokenizer T --out DIR [--small] [--checkpoint]``
writes them (``--small``: the same layouts at a few MB, for the dry run) and
prints one line per model.
"""

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import gguf
import numpy as np

#: Quantization blocks in one random pattern (a prime: rows of any width differ).
PATTERN_BLOCKS = 4099
Q8_0 = gguf.GGMLQuantizationType.Q8_0
F16 = gguf.GGMLQuantizationType.F16
Q8_BLOCK, Q8_BYTES = gguf.GGML_QUANT_SIZES[Q8_0]


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    dim: int
    ff: int
    heads: int
    kv_heads: int
    vocab: int
    context: int
    rope_base: float
    tied: bool  # the output layer is the token embedding (no output.weight)

    @property
    def head_dim(self):
        return self.dim // self.heads


#: Llama-3-8B's dimensions (its config.json) and SmolLM2-135M's (the bundled GGUF's metadata).
LLAMA3_8B = Shape("llama3-8b-random", 32, 4096, 14336, 32, 8, 128256, 8192, 500000.0, tied=False)
SMOLLM2_135M = Shape("smollm2-135m-random", 30, 576, 1536, 9, 3, 49152, 8192, 100000.0, tied=True)


def small(shape):
    """The same layout at a few MB (two layers, narrow), vocabulary kept: the dry run's."""
    return replace(shape, name=shape.name + "-small", layers=2, dim=256, ff=512, heads=4,
                   kv_heads=2 if shape.kv_heads < shape.heads else 4)


def tensors(shape):
    """[(name, rows, columns, is a norm)] of a llama-architecture model, in file order."""
    d, kv = shape.dim, shape.kv_heads * shape.head_dim
    out = [("token_embd.weight", shape.vocab, d, False)]
    for i in range(shape.layers):
        out += [(f"blk.{i}.attn_norm.weight", 1, d, True), (f"blk.{i}.attn_q.weight", d, d, False),
                (f"blk.{i}.attn_k.weight", kv, d, False), (f"blk.{i}.attn_v.weight", kv, d, False),
                (f"blk.{i}.attn_output.weight", d, d, False), (f"blk.{i}.ffn_norm.weight", 1, d, True),
                (f"blk.{i}.ffn_gate.weight", shape.ff, d, False), (f"blk.{i}.ffn_up.weight", shape.ff, d, False),
                (f"blk.{i}.ffn_down.weight", d, shape.ff, False)]
    out.append(("output_norm.weight", 1, d, True))
    if not shape.tied:
        out.append(("output.weight", shape.vocab, d, False))
    return out


def read_tokenizer(path):
    """{GGUF key: (value, type, sub type)} of the tokenizer fields in the GGUF at ``path``."""
    reader = gguf.GGUFReader(path)
    return {key: (field.contents(), field.types[0], field.types[1] if len(field.types) > 1 else None)
            for key, field in reader.fields.items() if key.startswith("tokenizer.")}


def padded(fields, vocab):
    """``fields`` with the vocabulary grown to ``vocab`` tokens (normal ones that
    no merge produces, so no text ever tokenizes to them)."""
    tokens = list(fields["tokenizer.ggml.tokens"][0])
    if len(tokens) > vocab:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, more than the shape's {vocab}")
    extra = vocab - len(tokens)
    out = dict(fields)
    grown = {"tokenizer.ggml.tokens": [f"<pad_{i}>" for i in range(extra)], "tokenizer.ggml.token_type": [1] * extra,
             "tokenizer.ggml.scores": [0.0] * extra}
    for key, more in grown.items():
        if key in fields:
            value, *types = fields[key]
            out[key] = (list(value) + more, *types)
    return out


def control_tokens(fields):
    """Ids whose output row is zeroed: every non-normal token and the named end/start ids."""
    ids = {i for i, t in enumerate(fields["tokenizer.ggml.token_type"][0]) if t != 1}
    for key in ("bos", "eos", "eot", "eom", "padding", "unknown"):
        value = fields.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            ids.add(int(value[0]))
    return sorted(ids)


def _pattern(rng, qtype, columns):
    """One random block of weights scaled for ``columns`` inputs (std 1/sqrt(columns)), as raw bytes."""
    std = 1.0 / np.sqrt(columns)
    if qtype == Q8_0:
        blocks = np.empty((PATTERN_BLOCKS, Q8_BYTES), dtype=np.uint8)
        blocks[:, :2] = np.full((PATTERN_BLOCKS, 1), np.float16(std / 73.6)).view(np.uint8)
        blocks[:, 2:] = rng.integers(-127, 128, size=(PATTERN_BLOCKS, Q8_BLOCK), dtype=np.int8).view(np.uint8)
        return blocks.reshape(-1)
    return (rng.standard_normal(PATTERN_BLOCKS * 32) * std).astype(np.float16).view(np.uint8)


def _row_bytes(qtype, columns):
    return columns // Q8_BLOCK * Q8_BYTES if qtype == Q8_0 else columns * 2


def write_model(path, shape, tokenizer, qtype=Q8_0, seed=0):
    """Write ``shape`` with random weights (``qtype`` Q8_0 or F16; norms F32,
    all ones) and ``tokenizer`` (a GGUF's path, or read_tokenizer's fields) to
    ``path``. Returns a summary dict (bytes, seconds, tensors, zeroed rows)."""
    started = time.monotonic()
    fields = padded(tokenizer if isinstance(tokenizer, dict) else read_tokenizer(tokenizer), shape.vocab)
    zero = control_tokens(fields)
    if qtype == Q8_0 and any(c % Q8_BLOCK for _, _, c, norm in tensors(shape) if not norm):
        raise ValueError(f"{shape.name}: Q8_0 needs widths divisible by {Q8_BLOCK}")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(shape.name)
    writer.add_description("random weights written by bench/gpu_models.py: a speed test, not a language model")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.dim)
    writer.add_feed_forward_length(shape.ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == Q8_0 else gguf.LlamaFileType.MOSTLY_F16)
    for key, (value, vtype, sub) in fields.items():
        writer.add_key_value(key, value, vtype, sub_type=sub)
    layout = tensors(shape)
    for name, rows, columns, norm in layout:
        if norm:
            writer.add_tensor_info(name, (columns,), np.dtype(np.float32), columns * 4)
        else:
            nbytes = rows * _row_bytes(qtype, columns)
            writer.add_tensor_info(name, (rows, _row_bytes(qtype, columns)), np.dtype(np.uint8), nbytes,
                                   raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    patterns = {}
    total = 0
    for k, (name, rows, columns, norm) in enumerate(layout):
        if norm:
            data = np.ones(columns, dtype=np.float32)
        else:
            if columns not in patterns:
                patterns[columns] = _pattern(rng, qtype, columns)
            row = _row_bytes(qtype, columns)
            block = Q8_BYTES if qtype == Q8_0 else 64
            # Each tensor starts at another place of the pattern: the layers differ.
            start = (k * 977 % PATTERN_BLOCKS) * block
            pattern = np.concatenate([patterns[columns][start:], patterns[columns][:start]])
            data = np.resize(pattern, rows * row).reshape(rows, row)
            if name == ("token_embd.weight" if shape.tied else "output.weight"):
                data[zero] = 0
        writer.write_tensor_data(data)
        total += data.nbytes
    writer.close()
    return {"name": shape.name, "path": str(path), "qtype": qtype.name, "bytes": Path(path).stat().st_size,
            "weight_bytes": total, "tensors": len(layout), "zeroed_rows": len(zero),
            "seconds": round(time.monotonic() - started, 2), "shape": asdict(shape)}


def write_checkpoint(out, shape, tokenizer_model, seed=0):
    """A transformers Llama model of ``shape`` built from its config with torch's
    own random initialisation (seeded), in bf16, saved as a safetensors
    checkpoint folder ``out`` with the tokenizer of the GGUF model
    ``tokenizer_model`` (transformers converts it). Returns a summary dict."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    started = time.monotonic()
    source = Path(tokenizer_model)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.dim, intermediate_size=shape.ff,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, max_position_embeddings=shape.context,
                         rope_theta=shape.rope_base, rms_norm_eps=1e-5, tie_word_embeddings=shape.tied,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    parameters = sum(p.numel() for p in model.parameters())
    return {"name": shape.name + "-hf", "path": str(out), "parameters": parameters,
            "bytes": sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file()),
            "seconds": round(time.monotonic() - started, 2), "shape": asdict(shape)}


def write_all(out, tokenizer, small_size=False, checkpoint=False):
    """The GPU check's models into ``out``: {"big": summary, "small": summary}, and
    with ``checkpoint`` "hf": the small shape as a transformers checkpoint folder."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    big, little = (small(LLAMA3_8B), small(SMOLLM2_135M)) if small_size else (LLAMA3_8B, SMOLLM2_135M)
    tokenizer = read_tokenizer(tokenizer)  # seconds of the gguf reader's time: once
    written = {"small": write_model(out / f"{little.name}.F16.gguf", little, tokenizer, F16, seed=2)}
    if checkpoint:
        written["hf"] = write_checkpoint(out / f"{little.name}-hf", little, written["small"]["path"], seed=3)
    written["big"] = write_model(out / f"{big.name}.Q8_0.gguf", big, tokenizer, Q8_0, seed=1)
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="a GGUF holding the tokenizer (the pack's tokenizer.gguf)")
    ap.add_argument("--out", required=True, help="folder to write the models into")
    ap.add_argument("--small", action="store_true", help="the same layouts at a few MB")
    ap.add_argument("--checkpoint", action="store_true",
                    help="also the small shape as a transformers checkpoint (needs torch and transformers)")
    ap.add_argument("--json", default="", help="also write the summaries here")
    opts = ap.parse_args(argv)
    written = write_all(opts.out, opts.tokenizer, opts.small, opts.checkpoint)
    for role, info in written.items():
        print(f"model_{role}={info['name']} {info.get('qtype', 'bf16 safetensors')} {info['bytes'] / 2**20:.1f} MiB "
              f"in {info['seconds']:.1f} s ({info['path']})", flush=True)
    if opts.json:
        Path(opts.json).write_text(json.dumps(written, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
