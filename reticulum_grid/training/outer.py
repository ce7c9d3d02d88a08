"""Local steps with rare averaging (DiLoCo): the outer step, frozen LoRA A, and the choice of sync.

A multi-tower job syncs its replicas in one of two ways (the job option ``sync``):

- ``ddp``: every step all-reduces the LoRA gradients (training/distributed.py);
- ``local``: each replica takes ``local_steps`` (H) AdamW steps on its own rows
  of the global batches, then the replicas' parameter deltas from the last
  average are averaged, and an outer optimiser takes one step on that
  pseudo-gradient (training/local_steps.py). DiLoCo (Douillard et al. 2023,
  arXiv 2311.08105) showed it matches synchronous training while
  communicating ~500x less. The outer optimiser is SGD (``outer_lr``,
  ``outer_momentum``, Nesterov when the momentum is above 0); its default,
  learning rate 1 without momentum, is plain averaging (local SGD, FedAvg):
  see OUTER_LR for why not DiLoCo's 0.7 and 0.9;
- ``auto`` (the default): ``choose`` below, from the link as measured before
  training.

LoRA's update is B·A: averaging A and B separately is not averaging B·A
(FLoRA, arXiv 2409.05976). With ``freeze_a`` the A matrices stay at their
seeded initialisation (identical on every rank) and only B trains (FFA-LoRA,
Sun et al., ICLR 2024), so the average of the replicas' B·A is exactly the
average of B times A, and half the bytes travel.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SYNC_MODES = ("auto", "ddp", "local")
#: The outer step by default: the replicas' mean itself (learning rate 1, no momentum).
#: DiLoCo's Nesterov SGD (lr 0.7, momentum 0.9; arXiv 2311.08105) was tuned for pre-training
#: of ~180 rounds of H = 500, where the momentum has ten rounds (1 / (1 - 0.9)) to fill
#: and averages the rounds' noise. A LoRA job has a few rounds: there the momentum mostly
#: scales the step, by lr (1 + m + ... + m^r) in round r if the deltas agree (1.33x in the
#: first, 2.9x in the fourth, 7x at length), a larger learning rate than the job asked for,
#: which DDP does not take (the momentum-adjusted outer rate, arXiv 2509.10439). Measured
#: on the tailnet bench (docs/benchmarks.md): DiLoCo's step ended 9 % (H = 32) and 25 %
#: (H = 8) below DDP's loss, plain averaging within 1 % of it.
OUTER_LR = 1.0
OUTER_MOMENTUM = 0.0
#: ``auto`` keeps DDP while one all-reduce costs under this share of a step's compute,
#: and otherwise picks the smallest H that brings one sync under this share of H steps.
SYNC_SHARE = 0.10
#: The H ``auto`` may pick (DiLoCo ran H = 50..2000 on large models; a LoRA job is
#: short: at most 64 steps between averages keeps several averages in a job).
MIN_LOCAL_STEPS, MAX_LOCAL_STEPS = 4, 64


@dataclass(frozen=True)
class SyncChoice:
    """How the replicas of a job sync: ``mode`` "ddp" or "local", ``local_steps``
    (H; 1 for ddp) and ``reason`` (a sentence with the figures it came from)."""
    mode: str
    local_steps: int
    reason: str


def choose(requested: str, local_steps: int | None, allreduce_s: float, step_s: float, world: int) -> SyncChoice:
    """The sync of a job asked for ``requested`` ("auto", "ddp" or "local") with
    ``local_steps`` (H, or None to pick it), given ``allreduce_s`` (seconds of one
    all-reduce of the adapter's bytes, measured) and ``step_s`` (seconds of one
    step's compute on the slowest rank). One rank never needs local steps under
    ``auto``. Raises ValueError for an unknown mode."""
    if requested not in SYNC_MODES:
        raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, not {requested!r}")
    figures = (f"one all-reduce {allreduce_s * 1000:.1f} ms, one step {step_s * 1000:.1f} ms" if requested == "auto"
               else "not measured")
    if requested == "ddp" or (requested == "auto" and (world == 1 or allreduce_s < SYNC_SHARE * step_s)):
        why = "asked for" if requested == "ddp" else f"auto: the all-reduce is under {SYNC_SHARE:.0%} of a step"
        return SyncChoice("ddp", 1, f"{why} ({figures})")
    if local_steps:
        return SyncChoice("local", local_steps, f"local steps asked for, H={local_steps} ({figures})")
    needed = math.ceil(allreduce_s / (SYNC_SHARE * max(step_s, 1e-6)))
    h = min(MAX_LOCAL_STEPS, max(MIN_LOCAL_STEPS, needed))
    return SyncChoice("local", h, f"{requested}: H={h} brings a sync to "
                                  f"{allreduce_s / (h * max(step_s, 1e-6)):.0%} of H steps ({figures})")


def freeze_lora_a(model: "torch.nn.Module") -> int:
    """Stop the gradients of every LoRA A matrix in ``model`` (FFA-LoRA); returns how many."""
    frozen = 0
    for name, param in model.named_parameters():
        if ".lora_A." in name:
            param.requires_grad_(False)
            frozen += 1
    return frozen


class OuterStep:
    """The global copy of the trainable tensors (``anchor``, the last average,
    fp32 on the model's device) and the outer optimiser over it: torch's SGD
    with Nesterov momentum, whose step on the pseudo-gradient (anchor minus the
    replicas' mean) is DiLoCo's outer step."""

    def __init__(self, params: "list[torch.Tensor]", lr: float = OUTER_LR, momentum: float = OUTER_MOMENTUM) -> None:
        import torch

        self.params = params
        self.anchor = [torch.nn.Parameter(p.detach().float().clone()) for p in params]
        self.optimizer = torch.optim.SGD(self.anchor, lr=lr, momentum=momentum, nesterov=momentum > 0)

    def reset(self) -> None:
        """Put the anchor into the model's tensors (a new round starts from the average)."""
        import torch

        with torch.no_grad():
            for p, a in zip(self.params, self.anchor):
                p.copy_(a)

    def delta(self) -> "torch.Tensor":
        """anchor - params, flattened into one fp32 vector (the bytes one replica sends)."""
        import torch

        return torch.cat([(a.detach() - p.detach().float()).reshape(-1) for p, a in zip(self.params, self.anchor)])

    def step(self, mean_delta: "torch.Tensor") -> None:
        """One outer step on ``mean_delta`` (the replicas' mean of ``delta()``), then
        the model's tensors hold the new anchor."""
        offset = 0
        for a in self.anchor:
            a.grad = mean_delta[offset:offset + a.numel()].view_as(a).to(a.dtype).clone()
            offset += a.numel()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.reset()

    def state(self) -> dict[str, Any]:
        return {"anchor": [a.detach().clone() for a in self.anchor], "optimizer": self.optimizer.state_dict()}

    def load(self, state: dict[str, Any]) -> None:
        import torch

        with torch.no_grad():
            for a, saved in zip(self.anchor, state["anchor"], strict=True):
                a.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.reset()
