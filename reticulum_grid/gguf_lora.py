"""GGUF facts for LoRA: which modules a base model has, and PEFT adapter -> GGUF LoRA.

The GGUF LoRA layout is llama.cpp's (its convert_lora_to_gguf.py): general.type
"adapter", adapter.type "lora", adapter.lora.alpha, and for each adapted weight
``<gguf tensor name>.lora_a`` (rank x in) and ``.lora_b`` (out x rank), the
names mapped from Hugging Face module names with the ``gguf`` library's own
tensor-name map. llama.cpp scales an adapter by alpha / rank.
"""

import gguf
import numpy as np

#: LoRA targets llama.cpp applies and we can convert: the linear projections.
#: (Embeddings and modules_to_save would need full tensors in the adapter.)
LINEAR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraError(ValueError):
    pass


def architecture(path):
    """(architecture name, block count, set of HF module leaf names) of a GGUF model."""
    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    blocks = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    name_map = _name_map(arch, blocks)
    gguf_names = {t.name.rsplit(".", 1)[0] for t in reader.tensors}
    modules = set()
    for hf_leaf in LINEAR_TARGETS:
        hf = f"model.layers.0.{_parent(hf_leaf)}.{hf_leaf}"
        mapped = name_map.get_name(hf + ".weight", try_suffixes=(".weight",))
        if mapped and mapped.rsplit(".", 1)[0] in gguf_names:
            modules.add(hf_leaf)
    return arch, blocks, modules


def _parent(leaf):
    return "self_attn" if leaf in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"


def _field(reader, key):
    return bytes(reader.fields[key].parts[-1]).decode("utf-8")


def _name_map(arch, blocks):
    arch_id = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if arch_id is None:
        raise LoraError(f"the gguf library does not know architecture {arch!r}")
    return gguf.get_tensor_name_map(arch_id, blocks)


def peft_to_gguf(tensors, alpha, base_path, out_path):
    """Write ``tensors`` (PEFT state dict: name -> numpy array) as a GGUF LoRA for
    the base model at ``base_path``. Raises LoraError for a tensor it cannot map
    or an adapter without LoRA pairs."""
    arch, blocks, _ = architecture(base_path)
    name_map = _name_map(arch, blocks)
    writer = gguf.GGUFWriter(str(out_path), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    pairs = 0
    for name, tensor in sorted(tensors.items()):
        module, part = _split_peft_name(name)
        mapped = name_map.get_name(module + ".weight", try_suffixes=(".weight",))
        if mapped is None:
            raise LoraError(f"no GGUF tensor for adapter tensor {name}")
        writer.add_tensor(f"{mapped}.lora_{part}", np.ascontiguousarray(tensor, dtype=np.float32))
        pairs += part == "a"
    if not pairs:
        raise LoraError("the adapter holds no LoRA tensors")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return pairs


def _split_peft_name(name):
    # base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight -> (model.layers.0..., "a")
    stem = name.removeprefix("base_model.model.")
    if ".lora_A." in stem:
        return stem.split(".lora_A.")[0], "a"
    if ".lora_B." in stem:
        return stem.split(".lora_B.")[0], "b"
    raise LoraError(f"{name} is not a LoRA A/B tensor (only LoRA on linear layers converts)")
