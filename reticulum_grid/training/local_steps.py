"""Local steps with rare averaging (DiLoCo, outer.py) for a multi-tower job: the rank's loop.

Started by training/distributed.py (which joins the ranks, restores the last
checkpoint and picks the sync) when a job's sync is ``local``. The job has M
replicas (``units``, fixed for its life as in DDP); rank r holds replicas
r, r+N, ... Replica u trains on rows u, u+M, ... of each global batch (the
rows DDP's unit u computes), with its own AdamW (the job's learning rate and
linear decay) and the mean loss over its own tokens. A round is H steps
(``local_steps``), aligned to multiples of H so a resumed job starts on one.
At a round's end each rank sums its replicas' deltas (the last average minus
the replica's adapter, fp32), one all-reduce adds the ranks' sums, and every
rank takes the same outer step on the mean (outer.OuterStep); every replica
starts the next round from the result. A rank holding several replicas (a
job resumed on fewer towers, or run on one) trains them one after another
from the same average, so the arithmetic is the mode's own whatever N is;
dropout draws from a seed of (job seed, step, replica) for the same reason.

Per round the ranks exchange one all-reduce of the trainable bytes (halved
with ``freeze_a``) and one gather of the round's losses, instead of DDP's
all-reduce every step; rank 0 then emits the round's ``step`` events at once
(a step's loss is the sum over all replicas' tokens divided by their count,
as in DDP; elapsed_s spreads the round's time evenly over its steps) with
``bytes_per_step`` (bytes this rank sent to the averages so far divided by
the steps done) and ``step_s`` (seconds per step of the round, its sync
included). Checkpoints are written at the end of a round (the first after each
``checkpoint_every`` steps) and hold the average and the outer optimiser's
momentum: a job resumed after a lost rank starts from the last average, each
replica with a fresh AdamW state (the inner states are per replica and never
cross the link).
"""

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reticulum_grid.training import trainer
from reticulum_grid.training.outer import OUTER_LR, OUTER_MOMENTUM, OuterStep
from reticulum_grid.training.ranks import Job, gather

if TYPE_CHECKING:
    import torch


@dataclass
class Traffic:
    """What syncing cost this rank in this run: ``syncs`` all-reduces of the
    adapter (none with one rank) of ``bytes`` in all, ``sync_s`` seconds spent
    in them (local steps only), over ``steps`` steps of ``seconds`` (compute and sync)."""
    bytes: int = 0
    sync_s: float = 0.0
    syncs: int = 0
    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0

    def summary(self) -> dict[str, Any]:
        return {"bytes_total": self.bytes, "syncs": self.syncs, "sync_s": round(self.sync_s, 4),
                "bytes_per_step": round(self.bytes / max(1, self.steps), 1),
                "step_s": round(self.seconds / max(1, self.steps), 5)}


def describe(done: dict[str, Any]) -> str:
    """One line for a job's history from its ``done`` event (Traffic.summary's fields)."""
    return (f"sync {done.get('sync')}: its last run sent {done.get('bytes_total')} bytes in {done.get('syncs')} "
            f"all-reduces of the adapter's {'deltas' if done.get('sync') == 'local' else 'gradients'}, "
            f"{done.get('bytes_per_step')} bytes and {done.get('step_s')} s per step")


def replica_seed(seed: int, step: int, unit: int) -> int:
    """The torch seed of replica ``unit``'s step ``step``: the same on whichever rank holds it."""
    return (seed * 1_000_003 + step * 4_099 + unit) % (1 << 63)


def loop(job: Job, local_steps: int, state: dict[str, Any] | None) -> tuple[float | None, Traffic]:
    """Train from the checkpoint ``state`` (None: from the start) to the job's
    last step in rounds of ``local_steps``. Returns (the last step's loss, what
    the averages cost)."""
    import torch

    spec, dp = job.spec, job.dp
    params = [p for p in job.model.parameters() if p.requires_grad]
    outer = OuterStep(params, spec.get("outer_lr") or OUTER_LR, _momentum(spec))
    step = 0
    if state is not None:
        outer.load(state["outer"])
        torch.set_rng_state(state["rng"])
        step = int(state["step"])
    mine = list(range(dp["rank"], dp["units"], dp["world_size"]))
    inner = {u: torch.optim.AdamW(params, lr=spec["learning_rate"]) for u in mine}
    traffic, loss, started = Traffic(), None, time.monotonic()
    job.model.train()
    while step < job.total:
        end = min(job.total, (step // local_steps + 1) * local_steps)
        begun = time.monotonic()
        losses, delta, tokens = _round(job, outer, inner, step, end)
        traffic.tokens += tokens
        computed = time.monotonic() - begun
        if dp["world_size"] > 1:
            import torch.distributed as dist
            dist.all_reduce(delta)
        outer.step(delta / dp["units"])
        if dp["world_size"] > 1:
            traffic.syncs += 1
            traffic.bytes += delta.numel() * delta.element_size()
        traffic.sync_s += time.monotonic() - begun - computed
        loss = _report(job, losses, step, end, begun, started, computed, traffic)
        if dp["rank"] == 0 and step // spec["checkpoint_every"] != end // spec["checkpoint_every"] and end < job.total:
            from reticulum_grid.training import checkpoint
            state = {"outer": outer.state(), "step": end, "local_steps": local_steps, "rng": torch.get_rng_state()}
            checkpoint.save(job.job_dir / trainer.CHECKPOINT, state)
            job.events.emit("checkpoint", step=end)
        step = end
    return loss, traffic


def _momentum(spec: trainer.Spec) -> float:
    value = spec.get("outer_momentum")
    return OUTER_MOMENTUM if value is None else float(value)


def _round(job: Job, outer: OuterStep, inner: "dict[int, torch.optim.Optimizer]", step: int,
           end: int) -> "tuple[torch.Tensor, torch.Tensor, int]":
    """Steps ``step``..``end`` of every replica this rank holds, each from the
    last average. Returns (per step: loss sum and token count over these
    replicas, float64 [2, end - step]; the sum of their deltas, fp32; the
    global batches' tokens)."""
    import torch

    spec, units = job.spec, job.dp["units"]
    device = next(job.model.parameters()).device
    batches = [trainer.make_batch(job.examples, spec, s, job.steps_per_epoch, job.tokenizer.pad_token_id, "cpu")
               for s in range(step, end)]
    losses = torch.zeros(2, end - step, dtype=torch.float64)
    total: torch.Tensor | None = None
    for unit, optimizer in inner.items():
        outer.reset()
        for i, batch in enumerate(batches):
            rows = slice(unit, spec["batch_size"], units)
            targets = batch["labels"][rows, 1:].to(device)
            count = int((targets != -100).sum())
            torch.manual_seed(replica_seed(spec["seed"], step + i, unit))
            logits = job.model(input_ids=batch["input_ids"][rows].to(device),
                               attention_mask=batch["attention_mask"][rows].to(device)).logits
            part = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                                     targets.reshape(-1), ignore_index=-100, reduction="sum")
            (part / max(1, count)).backward()
            for group in optimizer.param_groups:  # the job's linear decay, as trainer.py's scheduler
                group["lr"] = spec["learning_rate"] * max(0.0, 1 - (step + i) / job.total)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses[0, i] += part.item()
            losses[1, i] += count
        delta = outer.delta()
        total = delta if total is None else total + delta
    assert total is not None  # every rank holds at least one replica (distributed.py checks N <= M)
    return losses, total, sum(int(b["attention_mask"].sum()) for b in batches)


def _report(job: Job, losses: "torch.Tensor", step: int, end: int, begun: float, started: float,
            computed: float, traffic: Traffic) -> float:
    """Gather the round's losses and speeds; rank 0 emits its step events. Returns the last step's loss."""
    import torch

    n = end - step
    round_s = time.monotonic() - begun
    samples = sum(len(range(u, job.spec["batch_size"], job.dp["units"]))
                  for u in range(job.dp["rank"], job.dp["units"], job.dp["world_size"]))
    device = next(job.model.parameters()).device
    row = torch.cat([losses.reshape(-1), torch.tensor([end, samples * n / max(computed, 1e-9)], dtype=torch.float64)])
    ranks = gather(row.to(device), job.dp["world_size"])
    traffic.steps += n
    traffic.seconds += round_s
    if job.dp["rank"] != 0:
        return 0.0
    sums = [sum(r[i] for r in ranks) for i in range(2 * n)]
    before = begun - started
    loss = 0.0
    for i in range(n):
        loss = sums[i] / max(1.0, sums[n + i])
        so_far = before + round_s * (i + 1) / n
        done = step + i + 1
        job.events.emit("step", step=done, total_steps=job.total, loss=round(loss, 5),
                        lr=job.spec["learning_rate"] * max(0.0, 1 - done / job.total),
                        tokens_per_s=round(traffic.tokens / (time.monotonic() - started), 1),
                        eta_s=round((job.total - done) * so_far / (done - job.first), 1),
                        elapsed_s=round(so_far, 4), bytes_per_step=round(traffic.bytes / traffic.steps, 1),
                        step_s=round(round_s / n, 5), sync="local",
                        ranks=[{"rank": r, "step": int(v[2 * n]), "samples_per_s": round(v[2 * n + 1], 2)}
                               for r, v in enumerate(ranks)])
    return loss
