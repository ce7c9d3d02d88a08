"""A GGUF base model converted once into a Hugging Face checkpoint, and kept.

transformers reads a GGUF in Python: its vocabulary twice, a tensor-name map
built again for every tensor, then every tensor dequantized. For the bundled
135M model that took 32 s on one CPU thread before a job's first step (6 s of
the steps themselves followed), and every rank of a data-parallel job paid it
again. The checkpoint it produces (``save_pretrained``: config, tokenizer and
safetensors in the dtype it was loaded in) loads in about a second, so the
first job on a base converts it and every later job and rank on this machine
loads the copy; the weights are the same bits.

Copies live under ``converted_dir()`` (``RNGRID_CACHE`` or ``~/.cache/rngrid``,
then ``converted/``), private to the user, one folder per GGUF (its resolved
path, size and modification time) and dtype. At most KEEP are kept, the least
recently used removed first: a 7B base in bfloat16 is a 14 GiB copy. A copy is
written to a temporary folder and renamed into place under a lock, so ranks
starting together convert once and the others wait for it.
"""

import fcntl
import hashlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from reticulum_grid.node.cache import cache_root

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

#: Converted bases kept at most (least recently used removed first).
KEEP = 2
#: What marks a copy as whole: written last, after the weights and tokenizer.
DONE = "converted.done"


def converted_dir() -> Path:
    """The folder the converted copies live in."""
    return cache_root() / "converted"


def key(gguf_path: Path, dtype: "torch.dtype") -> str:
    """The copy's folder name for ``gguf_path`` (resolved path, size, mtime) loaded as ``dtype``."""
    stat = gguf_path.stat()
    ident = f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{dtype}"
    return f"{gguf_path.stem[:40]}-{str(dtype).removeprefix('torch.')}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def load(gguf_path: Path, dtype: "torch.dtype") -> "tuple[PreTrainedTokenizerBase, torch.nn.Module]":
    """(tokenizer, model on the CPU) of the GGUF at ``gguf_path`` in ``dtype``, from the
    kept copy, converting it first if there is none. Raises what transformers raises
    for a GGUF it cannot read; OSError when the copy cannot be written."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = converted_dir()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    copy = root / key(gguf_path, dtype)
    with open(root / f"{copy.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first rank converts; the others wait, then load its copy
        if not (copy / DONE).exists():
            _convert(gguf_path, dtype, copy)
            _forget_old(root, keep=copy)
    os.utime(copy / DONE)  # recently used: the last to go
    return AutoTokenizer.from_pretrained(copy), AutoModelForCausalLM.from_pretrained(copy, dtype=dtype)


def _convert(gguf_path: Path, dtype: "torch.dtype", copy: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = copy.with_name(copy.name + f".part-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).save_pretrained(work)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=dtype)
        # Dequantized on loading, the weights are plain ``dtype`` tensors, but transformers still marks the
        # model as GGUF-quantized and refuses to save it: drop the mark.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(work)
        (work / DONE).write_text(str(gguf_path.resolve()) + "\n")
        shutil.rmtree(copy, ignore_errors=True)
        work.rename(copy)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _forget_old(root: Path, keep: Path) -> None:
    copies = sorted((d for d in root.iterdir() if (d / DONE).exists() and d != keep),
                    key=lambda d: (d / DONE).stat().st_mtime, reverse=True)
    for old in copies[KEEP - 1:]:
        shutil.rmtree(old, ignore_errors=True)
        (root / f"{old.name}.lock").unlink(missing_ok=True)
