"""``rngrid train``, ``jobs``, ``inbox``: LoRA jobs and their notifications."""


import sys
import time
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from links.wire import WireError
from reticulum_grid.training.outer import OUTER_LR, OUTER_MOMENTUM
from reticulum_grid.training.request import TrainRequest

from reticulum_grid.cli.common import (client_options, err, fail, json_line, main, open_grid, out, styled, visible,
                                       with_progress)

if TYPE_CHECKING:  # imported where used: a command that needs no grid never loads RNS
    from reticulum_grid.client import Grid


@main.command()
@client_options
@click.option("--base", required=True, help="Base model alias (or blob id).")
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False, exists=True),
              help="Training data: JSONL of {\"messages\": [...]} or {\"text\": ...} lines.")
@click.option("--output", "output_alias", required=True, help="Alias of the adapter this job produces.")
@click.option("--tower", default="auto", show_default=True, help="Tower name or hash, or auto.")
@click.option("--towers", default=None, help="Train on several towers at once (data-parallel): NAME,NAME,... "
                                             "(the first coordinates) or auto:N.")
@click.option("--rank", default=8, show_default=True, type=click.IntRange(1))
@click.option("--alpha", default=16.0, show_default=True)
@click.option("--dropout", default=0.0, show_default=True)
@click.option("--target-modules", default="q_proj,k_proj,v_proj,o_proj", show_default=True)
@click.option("--lr", "learning_rate", default=2e-4, show_default=True)
@click.option("--epochs", default=None, type=click.IntRange(1))
@click.option("--max-steps", default=None, type=click.IntRange(1))
@click.option("--seq-len", default=512, show_default=True, type=click.IntRange(8))
@click.option("--batch-size", default=4, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0))
@click.option("--checkpoint-every", default=50, show_default=True, type=click.IntRange(1))
@click.option("--sync", type=click.Choice(["auto", "ddp", "local"]), default="auto", show_default=True,
              help="With --towers: all-reduce every step (ddp), local steps with rare averages (local), "
                   "or pick by the towers' measured link (auto).")
@click.option("--local-steps", default=None, type=click.IntRange(1),
              help="Steps between averages (default: by the link).")
@click.option("--outer-lr", default=OUTER_LR, show_default=True,
              help="Outer learning rate of local steps (1 with no momentum: plain averaging; DiLoCo's: 0.7).")
@click.option("--outer-momentum", default=OUTER_MOMENTUM, show_default=True,
              help="Outer Nesterov momentum of local steps (DiLoCo's: 0.9, for jobs of many averages).")
@click.option("--freeze-a", is_flag=True, default=None,
              help="Train only LoRA's B matrices: exact averages, half the bytes.")
@click.option("--notify", default=None, help="LXMF address for the result (default: this identity's).")
@click.option("--detach", is_flag=True, help="Print the job id and return instead of watching.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.pass_context
def train(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, base: str, data_path: str,
          output_alias: str, tower: str, towers: str | None, target_modules: str, detach: bool, as_json: bool,
          **options: Any) -> None:
    """Start LoRA fine-tuning on a tower; it keeps running if you leave."""
    try:
        request = TrainRequest.from_map({
            "base": base, "output_alias": output_alias,
            "target_modules": [t.strip() for t in target_modules.split(",") if t.strip()],
            **{k: v for k, v in options.items() if v is not None}})
    except WireError as e:
        fail(f"{e.code}: {e.message}")
    grid = open_grid(ctx, connect, rns_config)
    entry, job_id = with_progress(as_json, "sending", lambda progress: grid.train(request, data_path, tower, progress,
                                                                                       towers=towers))
    if as_json:
        json_line({"job_id": job_id, "tower": entry.name})
    else:
        err.print(styled("job ", (job_id, "bold"), f" on {entry.name}; watch it with: rngrid jobs watch {job_id}"))
        if detach:
            print(visible(job_id), flush=True)  # stdout, for JOB=$(rngrid train ... --detach)
    if not detach:
        _watch(grid, job_id, entry.name, as_json)


@main.group(invoke_without_command=True)
@client_options
@click.option("--tower", default=None, help="Only this tower.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def jobs(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, tower: str | None,
         as_json: bool) -> None:
    """List your training jobs (watch and cancel them with the subcommands)."""
    ctx.obj["client"] = (connect, rns_config)
    if ctx.invoked_subcommand is not None:
        return
    grid = open_grid(ctx, connect, rns_config)
    try:
        rows = grid.jobs(tower)
    except WireError as e:
        fail(f"{e.code}: {e.message}")
    if as_json:
        json_line([{"tower": name, **job} for name, job in rows])
        return
    table = Table("job", "tower", "state", "step", "loss", "adapter", "error")
    for name, job in rows:
        table.add_row(job["id"], name, job["state"], f"{job['step'] or 0}/{job['total_steps'] or '?'}",
                      f"{job['loss']:.4f}" if job["loss"] is not None else "-", job["adapter_alias"] or "-",
                      (job["error"] or "")[:60])
    out.print(table)


@jobs.command("watch")
@click.argument("job_id")
@click.option("--tower", default=None)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def jobs_watch(ctx: click.Context, job_id: str, tower: str | None, as_json: bool) -> None:
    """Follow a job's progress (from any client, as often as you like)."""
    _watch(open_grid(ctx, *ctx.obj["client"]), job_id, tower, as_json)


@jobs.command("cancel")
@click.argument("job_id")
@click.option("--tower", default=None)
@click.pass_context
def jobs_cancel(ctx: click.Context, job_id: str, tower: str | None) -> None:
    """Cancel a queued or running job."""
    try:
        job = open_grid(ctx, *ctx.obj["client"]).cancel_job(job_id, tower)
    except WireError as e:
        fail(f"{e.code}: {e.message}")
    err.print(f"job {job_id}: {job['state']}" + ("" if job["state"] == "cancelled" else ", cancel requested"))


def _watch(grid: "Grid", job_id: str, tower: str | None, as_json: bool) -> None:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )
    end = None
    bar = None if as_json else Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                                        MofNCompleteColumn(), TextColumn("{task.fields[info]}", markup=False),
                                        TimeRemainingColumn(), console=err)
    try:
        events = grid.watch(job_id, tower)  # finds the job's tower first: no bar for an unknown job
        if bar:
            bar.start()
            task = bar.add_task(visible(f"job {job_id}", newlines=False), total=None, info="")
        for event in events:
            if as_json:
                json_line(event)
            elif event["type"] == "started":
                if event.get("device"):
                    err.print(f"training on {event['device']}" + (
                        f" ({event.get('device_name')}, {event['precision']})" if event.get("precision") else ""))
                if event.get("sync") and event.get("world_size", 1) > 1:
                    err.print(_sync_line(event))
                if event.get("truncated"):
                    err.print(f"{event['truncated']} of {event.get('examples')} examples are longer than --seq-len "
                              f"{event.get('seq_len')} tokens and are cut: what comes after is not learned",
                              style="yellow")
            elif event["type"] == "progress" and bar is not None:  # bar is None only with --json, printed above
                ranks = "".join(f"  r{r['rank']}:{r['step']} {r['samples_per_s']:.1f}/s" for r in event.get("ranks", ()))
                bar.update(task, completed=event["step"], total=event["total_steps"],
                           info=f"loss {event['loss']:.4f}  lr {event['lr']:.2e}  {event['tokens_per_s']:.0f} tok/s"
                                + (f"  {event['step_s']:.2f} s/step  {event['bytes_per_step'] / 2**20:.2f} MiB/step"
                                   if event.get("step_s") is not None else "") + ranks)
            elif event["type"] == "note":
                err.print(event["text"], style="yellow")
            if event["type"] == "end":
                end = event
                if bar and event.get("total_steps"):
                    bar.update(task, completed=event.get("step") or 0, total=event["total_steps"])
    except WireError as e:
        fail(f"{e.code}: {e.message}")
    except KeyboardInterrupt:
        err.print(f"\nstopped watching; job {job_id} keeps running")
        sys.exit(130)
    finally:
        if bar:
            bar.stop()
    if end and not as_json:
        err.print(f"job {job_id} {end['state']}"
                  + (f": adapter {end['adapter_alias']} ({end['adapter_blob']}), final loss {end['final_loss']:.4f}\n"
                     f"use it with: rngrid infer -m BASE_MODEL --adapter {end['adapter_alias']} \"...\""
                     if end["state"] == "succeeded" else f": {end.get('error') or ''}"))
    if end and end["state"] != "succeeded":
        sys.exit(1)


def _sync_line(event: dict[str, Any]) -> str:
    """How a multi-tower job's towers sync, as `rngrid route` shows a choice: the choice, then why."""
    what = "DDP (an all-reduce every step)" if event["sync"] == "ddp" else \
        f"local steps, an average every {event['local_steps']} steps"
    size = event.get("grad_bytes") or 0
    return (f"sync over {event['world_size']} towers: {what}; {size / 2**20:.2f} MiB per sync"
            f"{' (B only)' if event.get('freeze_a') else ''}\n  why: {visible(str(event.get('sync_reason', '')))}")


@main.command()
@client_options
@click.option("--wait", default=10.0, show_default=True, help="Seconds to listen for messages.")
@click.option("--from", "from_tower", default=None, help="Also collect messages kept for us on this tower.")
@click.option("--count", default=None, type=click.IntRange(1), help="Stop after this many messages.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.pass_context
def inbox(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, wait: float, from_tower: str | None,
          count: int | None, as_json: bool) -> None:
    """Receive LXMF messages (job notifications) for this identity."""
    import queue

    import RNS

    from reticulum_grid.training.notify import Inbox
    grid = open_grid(ctx, connect, rns_config)
    box = Inbox(grid.identity, ctx.obj["home"] / "lxmf")
    if not as_json:
        err.print(f"LXMF address {box.destination.hash.hex()}; listening {wait:.0f} s")
    if from_tower:
        try:
            entry = grid.find_tower(from_tower)
        except WireError as e:
            fail(f"{e.code}: {e.message}")
        if not box.sync_from(RNS.Identity.recall(entry.destination_hash)):
            err.print(f"could not collect from {entry.name}: it runs no propagation node "
                      "or did not answer; still listening", style="yellow")
    deadline, received = time.monotonic() + wait, 0
    while (left := deadline - time.monotonic()) > 0 and received != count:
        try:
            message = box.messages.get(timeout=left)
        except queue.Empty:
            break
        received += 1
        # Anyone can send an LXMF message: say which ones come from a tower this client trusts.
        message["trusted"] = message["source"] in grid.trust.trust.lxmf_sources()
        if as_json:
            json_line(message)
        else:
            warning = () if message["trusted"] else ((f"not from a trusted tower (sender {message['source']}): ",
                                                      "yellow"),)
            out.print(styled(*warning, (message["title"], "bold"), "\n", message["content"], "\n"))
