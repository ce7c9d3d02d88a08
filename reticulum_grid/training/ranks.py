"""What the loops of a multi-tower job's rank share (training/distributed.py's DDP,
training/local_steps.py's local steps): the job as a rank sees it, and the gather of
every rank's small figures."""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reticulum_grid.training import trainer
from reticulum_grid.training.trainer import Spec

if TYPE_CHECKING:  # imported where used: the tower never loads them
    import torch
    from transformers import PreTrainedTokenizerBase


@dataclass
class Job:
    """What a rank's loop needs: the job, its model and data, and ``first``, the step this run began from."""
    job_dir: Path
    spec: Spec
    events: trainer.Events
    model: "torch.nn.Module"
    examples: list[list[int]]
    tokenizer: "PreTrainedTokenizerBase"
    total: int
    steps_per_epoch: int
    dp: dict[str, Any]
    first: int = 0


def gather(row: "torch.Tensor", world: int) -> list[list[float]]:
    """Every rank's ``row`` (a small float64 tensor on the group's device), as lists, in rank order."""
    import torch
    import torch.distributed as dist

    if world == 1:
        return [row.tolist()]
    if dist.get_backend() != "nccl":
        row = row.cpu()  # gloo gathers host tensors (on CUDA it has all-reduce and broadcast only)
    rows = [torch.zeros_like(row) for _ in range(world)]
    dist.all_gather(rows, row)
    return [r.tolist() for r in rows]
