"""LoRA training worker: ``python -m reticulum_grid.training.trainer JOB_DIR``.

Runs in its own process so the tower stays responsive and the memory (VRAM)
is returned when it ends. Reads ``JOB_DIR/spec.json``, loads the base model
from its GGUF (converted once per machine: converted.py) or a safetensors checkpoint
directory, trains a PEFT LoRA with torch on CUDA (one GPU, the one with the
most free memory; bf16 where the GPU supports it, else fp16 with loss
scaling), MPS or CPU, and writes:

- ``checkpoint.safetensors`` every ``checkpoint_every`` steps (adapter weights,
  optimizer, scheduler, RNG, step; checkpoint.py: never pickled) so a killed
  job resumes where it was;
- ``adapter.safetensors``: the PEFT adapter (its config in the metadata);
- ``adapter.gguf``: the same adapter as a GGUF LoRA that llama.cpp loads.

Events go to stdout as JSON lines (everything else the libraries print goes
to stderr): ``started`` (device, device_name, precision, ...), ``step`` (step, total_steps, loss, lr, tokens_per_s,
eta_s, elapsed_s: seconds since this run's first step began, on the worker's
clock), ``checkpoint``, ``done`` (final_loss, device) or ``error`` (message).
"""

import contextlib
import json
import math
import os
import random
import re
import signal
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from reticulum_grid.training import checkpoint, converted

if TYPE_CHECKING:  # imported where used: the tower never loads them
    import torch
    from transformers import PreTrainedTokenizerBase

    from reticulum_grid.training.datasets import Example

#: A job's spec (jobs.py's Spec; training/request.py's TrainRequest.job_spec names its keys).
Spec = dict[str, Any]

SPEC = "spec.json"
CHECKPOINT = "checkpoint.safetensors"
ADAPTER = "adapter.safetensors"
ADAPTER_GGUF = "adapter.gguf"
#: A job id as jobs.py makes them (secrets.token_hex(6)): it names a directory, so nothing else is one.
JOB_ID_PATTERN = re.compile(r"[0-9a-f]{12}")


def check_job_id(job_id: object) -> str:
    """``job_id`` if it is one of ours (JOB_ID_PATTERN); else ValueError. Never a path piece."""
    if not isinstance(job_id, str) or not JOB_ID_PATTERN.fullmatch(job_id):
        raise ValueError(f"{str(job_id)[:64]!r} is not a job id (12 hex digits)")
    return job_id


def write_spec(job_dir: str | os.PathLike[str], spec: Spec) -> None:
    """Write ``job_dir/spec.json``, readable by this user only: a multi-tower
    spec holds the job's secret."""
    path = Path(job_dir) / SPEC
    tmp = path.with_name(SPEC + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(spec))
    os.replace(tmp, path)


class Events:
    """JSON-lines events on the real stdout; library prints go to stderr."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)

    def emit(self, kind: str, **fields: Any) -> None:
        self._out.write(json.dumps({"event": kind, **fields}) + "\n")


#: The tower's pid, set in a worker's environment by the tower that starts it (jobs.py).
TOWER_PID_ENV = "RNGRID_TOWER_PID"


def die_with_parent(interval_s: float = 0.5) -> None:
    """End this worker's process group when the tower that started it is gone
    (killed with SIGKILL, it cannot stop us): the orphan would train on, holding
    memory, while the restarted tower resumes the job in a new worker. The
    tower's pid comes from its environment: a tower killed while this worker
    was still starting has already left it to another parent."""
    parent = int(os.environ.get(TOWER_PID_ENV) or os.getppid())

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        # Our own group when we lead it (jobs.py starts us so), else only us.
        if os.getpgid(0) == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main() -> None:
    job_dir = Path(sys.argv[1])
    die_with_parent()
    events = Events()
    try:
        run(job_dir, json.loads((job_dir / SPEC).read_text()), events)
    except Exception as e:
        events.emit("error", message=f"{type(e).__name__}: {e}")
        raise SystemExit(1) from None


def run(job_dir: Path, spec: Spec, events: Events) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    from reticulum_grid.training.datasets import read_examples

    device, device_name, precision = pick_device(torch, spec.get("precision"))
    tokenizer, model = load_base(spec["base_path"], device, DTYPES[precision])
    batches, cut = tokenize(read_examples(spec["dataset_path"]), tokenizer, spec["seq_len"])
    model = add_lora(model, spec)
    steps_per_epoch = math.ceil(len(batches) / spec["batch_size"])
    total = spec.get("max_steps") or steps_per_epoch * (spec.get("epochs") or 1)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec["learning_rate"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / total))
    first = step = resume(job_dir, model, optimizer, scheduler)
    events.emit("started", total_steps=total, resumed_from=step, device=device, device_name=device_name,
                precision=precision, examples=len(batches), truncated=cut, seq_len=spec["seq_len"])
    # fp16 needs loss scaling (its small gradients underflow); bf16 and fp32 do not.
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    model.train()
    loss_value, started, tokens = None, time.monotonic(), 0
    while step < total:
        batch = make_batch(batches, spec, step, steps_per_epoch, tokenizer.pad_token_id, device)
        with torch.autocast("cuda", dtype=torch.float16) if scaler else contextlib.nullcontext():
            loss = model(**batch).loss
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        loss_value = loss.item()
        tokens += int(batch["attention_mask"].sum())
        elapsed = time.monotonic() - started
        events.emit("step", step=step, total_steps=total, loss=round(loss_value, 5), lr=scheduler.get_last_lr()[0],
                    tokens_per_s=round(tokens / elapsed, 1), eta_s=round((total - step) * elapsed / (step - first), 1),
                    elapsed_s=round(elapsed, 4))
        if step % spec["checkpoint_every"] == 0 and step < total:
            save_checkpoint(job_dir, model, optimizer, scheduler, step)
            events.emit("checkpoint", step=step)
    write_outputs(job_dir, model, spec)
    events.emit("done", final_loss=loss_value, total_steps=total, device=device)


#: torch dtype of the frozen base weights per precision (LoRA weights stay fp32: peft casts them).
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def pick_device(torch: ModuleType, precision: str | None = None) -> tuple[str, str, str]:
    """(device, its name, precision) for this job: the CUDA GPU with the most
    free memory, in bf16 where it supports it (Ampere and later) else fp16
    with loss scaling; MPS or the CPU in fp32. ``precision`` ("bf16" or
    "fp32"; a local worker spec's, never a request's: the wire schema has no
    such field) replaces the choice, e.g. bf16 on the CPU to compare it with
    a GPU at the same precision."""
    if precision not in (None, "bf16", "fp32"):
        raise ValueError(f"precision must be bf16 or fp32, not {precision!r}")
    if torch.cuda.is_available():
        index = max(range(torch.cuda.device_count()), key=lambda i: torch.cuda.mem_get_info(i)[0])
        torch.cuda.set_device(index)
        return f"cuda:{index}", torch.cuda.get_device_name(index), precision or (
            "bf16" if torch.cuda.is_bf16_supported() else "fp16")
    if torch.backends.mps.is_available():
        return "mps", "Apple GPU (MPS)", precision or "fp32"
    from reticulum_grid.node.hardware import cpu_name
    return "cpu", cpu_name(), precision or "fp32"


def load_base(path: str | os.PathLike[str], device: str, dtype: "str | torch.dtype | None" = None
              ) -> "tuple[PreTrainedTokenizerBase, torch.nn.Module]":
    """(tokenizer, model on ``device``); ``dtype``: torch dtype or its name
    (default bfloat16 on CUDA, else float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype or (
        torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    if path.is_dir():  # a safetensors checkpoint (config.json, tokenizer, *.safetensors)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    else:  # a GGUF: converted once per machine (training/converted.py says why)
        tokenizer, model = converted.load(path, dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model.to(device)


def tokenize(examples: "list[Example]", tokenizer: "PreTrainedTokenizerBase",
             seq_len: int) -> tuple[list[list[int]], int]:
    """(token id lists, one per example, cut to ``seq_len``; how many were cut)."""
    out: list[list[int]] = []
    cut = 0
    for example in examples:
        if "messages" in example:
            ids = tokenizer.apply_chat_template(example["messages"], tokenize=True, return_dict=False)
        else:
            ids = tokenizer(example["text"])["input_ids"] + [tokenizer.eos_token_id]
        cut += len(ids) > seq_len
        out.append(list(ids)[:seq_len])
    return out, cut


def add_lora(model: "torch.nn.Module", spec: Spec) -> "torch.nn.Module":
    """``model`` with the spec's LoRA; with ``freeze_a`` only the B matrices train (outer.py: FFA-LoRA)."""
    from peft import LoraConfig, get_peft_model

    from reticulum_grid.training.outer import freeze_lora_a

    config = LoraConfig(r=spec["rank"], lora_alpha=spec["alpha"], lora_dropout=spec["dropout"],
                        target_modules=spec["target_modules"], task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    if spec.get("freeze_a"):
        freeze_lora_a(model)
    return model


def make_batch(examples: list[list[int]], spec: Spec, step: int, steps_per_epoch: int, pad_id: int,
               device: str) -> "dict[str, torch.Tensor]":
    """The batch for ``step``: examples in a seeded order per epoch, so a resumed
    job sees the same batches as an uninterrupted one."""
    import torch

    epoch, index = divmod(step, steps_per_epoch)
    order = list(range(len(examples)))
    random.Random(spec["seed"] + epoch).shuffle(order)
    size = spec["batch_size"]
    picked = [examples[order[(index * size + k) % len(order)]] for k in range(size)]
    width = max(len(ids) for ids in picked)
    input_ids = torch.full((size, width), pad_id, dtype=torch.long)
    mask = torch.zeros((size, width), dtype=torch.long)
    for row, ids in enumerate(picked):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        mask[row, :len(ids)] = 1
    labels = input_ids.masked_fill(mask == 0, -100)
    return {"input_ids": input_ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def resume(job_dir: Path, model: "torch.nn.Module", optimizer: "torch.optim.Optimizer",
           scheduler: "torch.optim.lr_scheduler.LRScheduler") -> int:
    """Load the last checkpoint, if any. Returns the step to continue from."""
    import torch

    path = job_dir / CHECKPOINT
    if not path.exists():
        torch.manual_seed(json.loads((job_dir / SPEC).read_text())["seed"])
        return 0
    return apply_state(checkpoint.load(path), model, optimizer, scheduler)


def apply_state(state: dict[str, Any], model: "torch.nn.Module", optimizer: "torch.optim.Optimizer",
                scheduler: "torch.optim.lr_scheduler.LRScheduler") -> int:
    """Load a checkpoint's ``state`` (training_state's map) into the job. Returns its step."""
    import torch
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, state["adapter"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def training_state(model: "torch.nn.Module", optimizer: "torch.optim.Optimizer",
                   scheduler: "torch.optim.lr_scheduler.LRScheduler", step: int) -> dict[str, Any]:
    """What a checkpoint holds: adapter weights, optimizer, scheduler, RNG state, step."""
    import torch
    from peft import get_peft_model_state_dict

    return {"adapter": get_peft_model_state_dict(model), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "step": step}


def save_checkpoint(job_dir: Path, model: "torch.nn.Module", optimizer: "torch.optim.Optimizer",
                    scheduler: "torch.optim.lr_scheduler.LRScheduler", step: int) -> None:
    checkpoint.save(job_dir / CHECKPOINT, training_state(model, optimizer, scheduler, step))


def write_outputs(job_dir: Path, model: "torch.nn.Module", spec: Spec) -> None:
    """adapter.safetensors and adapter.gguf; an adapter with no trained weights is an error."""
    from peft import get_peft_model_state_dict
    from safetensors.numpy import save_file

    from reticulum_grid.training.gguf_lora import peft_to_gguf

    tensors = {k: v.detach().float().cpu().numpy() for k, v in get_peft_model_state_dict(model).items()}
    if not tensors or not any(k.endswith("lora_B.weight") and v.any() for k, v in tensors.items()):
        raise RuntimeError("the trained adapter is empty (no LoRA weights moved); nothing was published")
    config = model.peft_config["default"].to_dict()
    config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
    save_file(tensors, str(job_dir / ADAPTER), metadata={"peft_config": json.dumps(config, default=str)})
    peft_to_gguf(tensors, spec["alpha"], spec["base_path"], job_dir / ADAPTER_GGUF)


if __name__ == "__main__":
    main()
