"""PEFT adapter -> GGUF LoRA.

The GGUF LoRA layout is llama.cpp's (its convert_lora_to_gguf.py): general.type
"adapter", adapter.type "lora", adapter.lora.alpha, and for each adapted weight
``<gguf tensor name>.lora_a`` (rank x in) and ``.lora_b`` (out x rank), the
names mapped from Hugging Face module names with the ``gguf`` library's own
tensor-name map. llama.cpp scales an adapter by alpha / rank.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from reticulum_grid.store.gguf_info import LoraError, architecture, name_map


def base_architecture(base_path: str | os.PathLike[str]) -> tuple[str, int]:
    """(architecture, block count) of a base model: a GGUF file, or a safetensors
    checkpoint folder whose config.json names a model type the gguf library knows."""
    path = Path(base_path)
    if not path.is_dir():
        return architecture(path)[:2]
    try:
        config = json.loads((path / "config.json").read_text())
        arch, blocks = config["model_type"], int(config["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LoraError(f"{path} has no readable config.json with model_type and num_hidden_layers: {e}") from None
    if arch not in gguf.MODEL_ARCH_NAMES.values():
        raise LoraError(f"the gguf library has no architecture {arch!r} (model_type of {path / 'config.json'})")
    return arch, blocks


def peft_to_gguf(tensors: Mapping[str, npt.ArrayLike], alpha: float, base_path: str | os.PathLike[str],
                 out_path: str | os.PathLike[str]) -> int:
    """Write ``tensors`` (PEFT state dict: name -> numpy array) as a GGUF LoRA for
    the base model at ``base_path`` (a GGUF or a checkpoint folder). Raises
    LoraError for a tensor it cannot map or an adapter without LoRA pairs."""
    arch, blocks = base_architecture(base_path)
    names = name_map(arch, blocks)
    writer = gguf.GGUFWriter(str(out_path), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    pairs = 0
    for name, tensor in sorted(tensors.items()):
        module, part = _split_peft_name(name)
        mapped = names.get_name(module + ".weight", try_suffixes=(".weight",))
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


def _split_peft_name(name: str) -> tuple[str, str]:
    # base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight -> (model.layers.0..., "a")
    stem = name.removeprefix("base_model.model.")
    if ".lora_A." in stem:
        return stem.split(".lora_A.")[0], "a"
    if ".lora_B." in stem:
        return stem.split(".lora_B.")[0], "b"
    raise LoraError(f"{name} is not a LoRA A/B tensor (only LoRA on linear layers converts)")
