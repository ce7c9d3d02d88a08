"""Data-parallel LoRA worker: ``python -m reticulum_grid.training.distributed JOB_DIR``.

One process per tower (rank) of a multi-tower job. ``JOB_DIR/spec.json`` is a
training spec (trainer.py) plus ``dp``::

    {"world_size": N, "rank": r, "units": M,          # M: see below; fixed for the job's life
     "host": rank 0's data-plane address, "port": its store front's port,
     "secret": hex, "dataplane": this tower's data-plane address, "attempt": int,
     "peers": [the other ranks' data-plane addresses],   # rank 0: its front admits only these
     "backend": "gloo" | "nccl"}   # optional: default NCCL on CUDA, gloo on the CPU. Two ranks on
                                   # one GPU need gloo: NCCL refuses two ranks on one device

Every rank builds the same global batch of ``batch_size`` examples per step
(the same seeded order as a one-tower job). The global batch is cut into M
accumulation units, rows ``u, u+M, ...`` (torch's DistributedSampler split of the
batch, without the repeats it pads uneven shards with, which would change the
global batch); rank r computes units ``r, r+N, ...``, accumulating gradients,
and DDP all-reduces them over the PEFT model once per step. The loss is the sum
over the global batch's tokens divided by their count, so the gradient is the
same whatever N is, and with M fixed the arithmetic is the same too: a job
resumed on fewer ranks, or run on one, follows the same trajectory. That is
the spec's ``sync`` "ddp"; with "local" the M units are replicas that take
local steps and average rarely (training/local_steps.py); "auto" (the
default) picks one before training from the measured link (sync_choice,
outer.choose). A resumed job keeps the sync its checkpoint was written with.

Rank 0 owns the job: it reads the checkpoint and sends it to the others
(checkpoint.py bytes in a tensor: nothing a peer sends is unpickled),
writes checkpoints and the adapter, and emits the job's events: ``started``
(world_size, units, grad_bytes: the trainable LoRA bytes, all-reduced per
step by DDP and per average by local steps, allreduce_s: one such all-reduce,
timed before training under ``auto``, else None; sync, local_steps,
sync_reason, freeze_a), ``step`` (as trainer.py's, plus ``ranks``: every
rank's step and samples/s, ``sync``, ``bytes_per_step``, ``step_s``),
``checkpoint``, ``done`` (plus ``store_front``: connections admitted and
refused, and local_steps.Traffic.summary's fields) or ``error``. Tensors travel over
gloo (CPU) or NCCL (CUDA) bound to the data-plane interface; the store behind
rendezvous.py's authenticating front. A collective that does not complete
within ``COLLECTIVE_TIMEOUT_S`` (a rank died or was cut off) ends every rank
with an ``error`` event marked ``peer_lost``, exit code ``EXIT_PEER_LOST``.
The worker also ends when its tower does (trainer.die_with_parent).
"""

import contextlib
import json
import math
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reticulum_grid.training import checkpoint, local_steps, outer, rendezvous, trainer
from reticulum_grid.training.ranks import Job, gather
from reticulum_grid.training.trainer import Spec

if TYPE_CHECKING:  # imported where used: the tower never loads it
    import torch
    import torch.distributed as dist
    from transformers import PreTrainedTokenizerBase

#: Seconds a collective may take before the job counts a rank as lost.
COLLECTIVE_TIMEOUT_S = 30
#: Seconds the ranks wait for each other at the start (model loading included).
JOIN_TIMEOUT_S = 180
EXIT_PEER_LOST = 3
#: Largest checkpoint rank 0 may send the other ranks (bytes).
MAX_STATE_BYTES = 8 << 30


class PeerLost(RuntimeError):
    pass


def main() -> None:
    job_dir = Path(sys.argv[1])
    trainer.die_with_parent()
    events = trainer.Events()
    try:
        run(job_dir, json.loads((job_dir / trainer.SPEC).read_text()), events)
    except PeerLost as e:
        events.emit("error", message=str(e), peer_lost=True)
        os._exit(EXIT_PEER_LOST)  # a broken process group may hang at interpreter exit
    except Exception as e:
        events.emit("error", message=f"{type(e).__name__}: {e}")
        os._exit(1)
    os._exit(0)


def run(job_dir: Path, spec: Spec, events: trainer.Events) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    from reticulum_grid.training.datasets import read_examples

    dp = spec["dp"]
    world, rank, units = dp["world_size"], dp["rank"], dp["units"]
    if not 1 <= world <= units <= spec["batch_size"]:
        raise ValueError(f"{world} ranks, {units} units and a batch of {spec['batch_size']} do not fit")
    device, _, precision = trainer.pick_device(torch, spec.get("precision"))
    if device == "mps" or precision == "fp16":
        # gloo has no MPS tensors; fp16 would need one loss scaler agreed by every rank.
        device, precision = ("cpu", "fp32") if device == "mps" else (device, "fp32")
    tokenizer, model = trainer.load_base(spec["base_path"], device, trainer.DTYPES[precision])
    examples, cut = trainer.tokenize(read_examples(spec["dataset_path"]), tokenizer, spec["seq_len"])
    torch.manual_seed(spec["seed"])  # the same LoRA initialisation on every rank and in every run
    model = trainer.add_lora(model, spec)
    steps_per_epoch = math.ceil(len(examples) / spec["batch_size"])
    total = spec.get("max_steps") or steps_per_epoch * (spec.get("epochs") or 1)
    job = Job(job_dir, spec, events, model, examples, tokenizer, total, steps_per_epoch, dp)
    group = front = None
    try:
        if world > 1:
            group, front = join(dp, device)
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        # A collective (every rank takes part), only where it decides something: 3 all-reduces of the adapter.
        probe_s = allreduce_time(grad_bytes, group) if (spec.get("sync") or "auto") == "auto" else None
        state = fetch_state(job_dir, rank, group)
        choice = sync_choice(job, state, probe_s)
        job.first = int(state["step"]) if state else 0
        if rank == 0:
            events.emit("started", total_steps=total, resumed_from=job.first, device=device, examples=len(examples),
                        truncated=cut, seq_len=spec["seq_len"], world_size=world, units=units,
                        grad_bytes=grad_bytes, allreduce_s=probe_s, sync=choice.mode, local_steps=choice.local_steps,
                        sync_reason=choice.reason, freeze_a=bool(spec.get("freeze_a")))
        if choice.mode == "local":
            final_loss, traffic = local_steps.loop(job, choice.local_steps, state)
        else:
            final_loss, traffic = ddp(job, state, group, grad_bytes)
    except Exception as e:
        if world > 1 and _is_comm_error(e):
            raise PeerLost(f"rank {rank}: a collective failed or timed out ({COLLECTIVE_TIMEOUT_S} s): "
                           f"{type(e).__name__}: {str(e)[:300]}") from None
        raise
    if rank == 0:
        trainer.write_outputs(job_dir, model, spec)
        events.emit("done", final_loss=final_loss, total_steps=total, device=device, sync=choice.mode,
                    **traffic.summary(), store_front={"admitted": front.admitted, "refused": front.refused}
                    if isinstance(front, rendezvous.Front) else None)
    if group is not None:  # gloo's threads end before the interpreter does; else the exit may abort ("terminate called")
        import torch.distributed as dist
        dist.destroy_process_group()


def sync_choice(job: Job, state: dict[str, Any] | None, allreduce_s: float | None) -> outer.SyncChoice:
    """The job's sync: a checkpoint's own (a resumed job keeps its arithmetic),
    else ``outer.choose`` from the spec and, under ``auto`` with several ranks,
    the slowest rank's time of one step's forward and backward pass (measured
    here, then undone) and the all-reduce time."""
    import torch

    spec, world = job.spec, job.dp["world_size"]
    if state is not None:
        if "outer" in state:
            return outer.SyncChoice("local", int(state["local_steps"]), "resumed with local steps")
        return outer.SyncChoice("ddp", 1, "resumed with DDP")
    requested = spec.get("sync") or "auto"
    step_s, allreduce_s = 0.0, allreduce_s or 0.0
    if requested == "auto" and world > 1:
        step_s = probe_step(job)
        figures = torch.tensor([step_s, allreduce_s], dtype=torch.float64)
        import torch.distributed as dist
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)  # every rank decides from the same numbers
        step_s, allreduce_s = figures.tolist()
    return outer.choose(requested, spec.get("local_steps"), allreduce_s, step_s, world)


def probe_step(job: Job) -> float:
    """Seconds of the first step's forward and backward pass over this rank's
    units (its gradients are dropped; its random draws are reseeded after)."""
    import torch

    spec, units = job.spec, job.dp["units"]
    device = next(job.model.parameters()).device
    batch = trainer.make_batch(job.examples, spec, 0, job.steps_per_epoch, job.tokenizer.pad_token_id, "cpu")
    begun = time.monotonic()
    for unit in range(job.dp["rank"], units, job.dp["world_size"]):
        rows = slice(unit, spec["batch_size"], units)
        out = job.model(input_ids=batch["input_ids"][rows].to(device),
                        attention_mask=batch["attention_mask"][rows].to(device),
                        labels=batch["labels"][rows].to(device))
        out.loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    job.model.zero_grad(set_to_none=True)
    return time.monotonic() - begun


def ddp(job: Job, state: dict[str, Any] | None, group: "dist.ProcessGroup | None",
        grad_bytes: int) -> "tuple[float | None, local_steps.Traffic]":
    """DDP from ``state`` (None: the start) to the job's last step. Returns (the
    last step's loss, what the all-reduces cost)."""
    import torch

    model, spec = job.model, job.spec
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec["learning_rate"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / job.total))
    torch.manual_seed(spec["seed"])
    step = trainer.apply_state(state, model, optimizer, scheduler) if state else 0
    net = model
    if group is not None:
        # No start-up broadcast: torch's would send every parameter, the frozen base model too (540 MB for
        # SmolLM2-135M in fp32: 43 s on a 100 Mbit/s tailnet, past the collective timeout). Every rank holds
        # the same base blob, the same seeded LoRA and rank 0's checkpoint already (fetch_state).
        net = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False, init_sync=False)
    return loop(job, net, optimizer, scheduler, step, grad_bytes if group is not None else 0)


def _is_comm_error(e: BaseException) -> bool:
    import torch.distributed as dist

    return isinstance(e, (dist.DistError, RuntimeError, ConnectionError, TimeoutError))


def loop(job: Job, net: "torch.nn.Module", optimizer: "torch.optim.Optimizer",
         scheduler: "torch.optim.lr_scheduler.LRScheduler", step: int,
         grad_bytes: int) -> "tuple[float | None, local_steps.Traffic]":
    """Train from ``step`` to the job's last step, all-reducing ``grad_bytes``
    (0 with one rank) every step. Returns (the last step's loss, what it cost)."""
    import torch

    spec, dp, model, total = job.spec, job.dp, job.model, job.total
    world, rank, units = dp["world_size"], dp["rank"], dp["units"]
    mine = list(range(rank, units, world))
    traffic = local_steps.Traffic()
    samples = sum(len(range(unit, spec["batch_size"], units)) for unit in mine)
    first, started, tokens, loss = step, time.monotonic(), 0, None
    device = next(model.parameters()).device
    net.train()
    while step < total:
        begun = time.monotonic()
        batch = trainer.make_batch(job.examples, spec, step, job.steps_per_epoch, job.tokenizer.pad_token_id, "cpu")
        targets = batch["labels"][:, 1:]
        count = int((targets != -100).sum())
        loss_sum = 0.0
        for i, unit in enumerate(mine):
            rows = slice(unit, spec["batch_size"], units)
            last = i == len(mine) - 1
            with contextlib.nullcontext() if world == 1 or last else net.no_sync():
                logits = net(input_ids=batch["input_ids"][rows].to(device),
                             attention_mask=batch["attention_mask"][rows].to(device)).logits
                part = torch.nn.functional.cross_entropy(
                    logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets[rows].reshape(-1).to(device),
                    ignore_index=-100, reduction="sum")
                # DDP averages over the ranks: times world so the result is the global sum / count.
                (part * (world / count)).backward()
            loss_sum += part.item()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        elapsed = time.monotonic() - begun
        traffic.steps, traffic.bytes, traffic.syncs = traffic.steps + 1, traffic.bytes + grad_bytes, traffic.syncs + (
            grad_bytes > 0)
        ranks = gather(torch.tensor([step, samples / elapsed, loss_sum], dtype=torch.float64, device=device), world)
        loss = sum(r[2] for r in ranks) / count
        tokens += int(batch["attention_mask"].sum())
        traffic.seconds += time.monotonic() - begun
        if rank != 0:
            continue
        so_far = time.monotonic() - started
        job.events.emit("step", step=step, total_steps=total, loss=round(loss, 5),
                        lr=scheduler.get_last_lr()[0], tokens_per_s=round(tokens / so_far, 1),
                        eta_s=round((total - step) * so_far / (step - first), 1), elapsed_s=round(so_far, 4),
                        bytes_per_step=grad_bytes, step_s=round(elapsed, 5), sync="ddp",
                        ranks=[{"rank": r, "step": int(s), "samples_per_s": round(v, 2)} for r, (s, v, _) in
                               enumerate(ranks)])
        if step % spec["checkpoint_every"] == 0 and step < total:
            trainer.save_checkpoint(job.job_dir, model, optimizer, scheduler, step)
            job.events.emit("checkpoint", step=step)
    return loss, traffic


def join(dp: dict[str, Any], device: str) -> "tuple[dist.ProcessGroup, rendezvous.Front | rendezvous.Forwarder]":
    """Meet the other ranks through the store (behind its front on rank 0) and
    start the process group on the data-plane interface. Returns (the group,
    rank 0's Front or another rank's Forwarder)."""
    import torch.distributed as dist

    secret = bytes.fromhex(dp["secret"])
    interface = rendezvous.interface_of(dp["dataplane"])
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = interface
    join_timeout = timedelta(seconds=JOIN_TIMEOUT_S)
    if dp["rank"] == 0:
        store = dist.TCPStore("127.0.0.1", 0, dp["world_size"], is_master=True, timeout=join_timeout,
                              wait_for_workers=False, master_listen_fd=_loopback_listener())
        link: rendezvous.Front | rendezvous.Forwarder = rendezvous.Front(dp["host"], dp["port"], secret, store.port,
                                                                        peers=dp.get("peers", ()))
    else:
        link = rendezvous.Forwarder(dp["host"], dp["port"], secret, JOIN_TIMEOUT_S)
        store = dist.TCPStore("127.0.0.1", link.port, dp["world_size"], is_master=False, timeout=join_timeout)
    store = dist.PrefixStore(f"attempt-{dp.get('attempt', 0)}", store)
    # Everyone loads the model first: wait for all here, then the short collective timeout applies.
    store.set(f"ready/{dp['rank']}", "1")
    store.wait([f"ready/{r}" for r in range(dp["world_size"])], join_timeout)
    backend = dp.get("backend") or ("nccl" if device.startswith("cuda") else "gloo")
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"dp.backend must be nccl or gloo, not {backend!r}")
    dist.init_process_group(backend, store=store, rank=dp["rank"],
                            world_size=dp["world_size"], timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return dist.group.WORLD, link


def _loopback_listener() -> int:
    """A listening socket on 127.0.0.1 for the store (torch's own would listen on
    every interface). Its fd is handed to the TCPStore, which owns it from then on."""
    import socket

    sock = socket.create_server(("127.0.0.1", 0))
    fd = sock.detach()
    return fd


def fetch_state(job_dir: Path, rank: int, group: "dist.ProcessGroup | None") -> dict[str, Any] | None:
    """Rank 0's last checkpoint (checkpoint.py's map), on every rank; None
    before the first. It goes to the other ranks as checkpoint.py bytes in a
    uint8 tensor, never as a pickled object."""
    data = b""
    if rank == 0 and (job_dir / trainer.CHECKPOINT).exists():
        data = (job_dir / trainer.CHECKPOINT).read_bytes()
    if group is not None:
        data = broadcast_bytes(data, rank)
    if not data:
        return None
    state = checkpoint.unpack(data)
    if not isinstance(state, dict) or "step" not in state:
        raise checkpoint.CheckpointError("a checkpoint without a step")
    return state


def broadcast_bytes(data: bytes, rank: int, limit: int = MAX_STATE_BYTES) -> bytes:
    """Rank 0's ``data`` (bytes) on every rank: its length, then the bytes, as tensors."""
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    size = torch.tensor([len(data) if rank == 0 else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    count = int(size.item())
    if not 0 <= count <= limit:
        raise ValueError(f"rank 0 announced a {count}-byte checkpoint (limit {limit})")
    if count == 0:
        return b""
    buffer = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if rank == 0 else
              torch.empty(count, dtype=torch.uint8, device=device))
    dist.broadcast(buffer, src=0)
    return data if rank == 0 else bytes(buffer.cpu().numpy())


def allreduce_time(grad_bytes: int, group: "dist.ProcessGroup | None", repeats: int = 3) -> float:
    """Median seconds of one all-reduce of ``grad_bytes`` of float32 (what DDP
    moves per step), measured before training; 0 with one rank."""
    import torch
    import torch.distributed as dist

    if group is None:
        return 0.0
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    buffer = torch.zeros(grad_bytes // 4, dtype=torch.float32, device=device)
    times = []
    for _ in range(repeats):
        begun = time.monotonic()
        dist.all_reduce(buffer)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.monotonic() - begun)
    return round(sorted(times)[len(times) // 2], 5)


if __name__ == "__main__":
    main()
