"""``rngrid towers``, ``infer``, ``route``, ``demo``: discovery and inference."""

import dataclasses
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from links.wire import WireError

from reticulum_grid.cli.common import (
    ProgressBar,
    client_options,
    err,
    fail,
    json_line,
    main,
    open_grid,
    out,
    reported_errors,
    visible,
)

if TYPE_CHECKING:  # imported where used: a command that needs no grid never loads RNS
    from reticulum_grid.client import Grid, Text, ToolCallDelta, Usage
    from reticulum_grid.client.router import Choice
    from reticulum_grid.split.plan import Estimate, Part, Plan


@main.command()
@client_options
@click.option("--wait", default=5.0, show_default=True, help="Seconds to listen for towers.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def towers(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, wait: float, as_json: bool) -> None:
    """List the towers heard on the grid, each trusted one probed once: state
    "ok" with its RTT, or "silent" (no answer in its bound) / "failed" (and why).
    Towers this client does not trust are listed apart: heard, never used."""
    from reticulum_grid.client.grid import stranger_identity
    from reticulum_grid.client.rows import tower_row
    grid = open_grid(ctx, connect, rns_config)
    entries = grid.towers(wait=wait)
    grid.refresh(entries)
    rows = [tower_row(grid.table.get(e.destination_hash) or e, grid.health.get(e.destination_hash)) for e in entries]
    strangers = [{**tower_row(e, None), "identity": stranger_identity(e)} for e in grid.table.strangers()]
    if as_json:
        json_line(rows + strangers)
        return
    if not rows and not strangers:
        err.print(f"no towers heard within {wait:.0f} s")
        sys.exit(1)
    if rows:
        _print_towers(rows)
    if strangers:
        _print_strangers(strangers)
    if not rows:
        err.print(f"no trusted tower heard within {wait:.0f} s")
        sys.exit(1)


def _print_towers(rows: list[dict[str, Any]]) -> None:
    table = Table("name", "destination", "state", "hops", "age", "backend", "memory free/total", "models", "tok/s")
    table.columns[1].overflow = "fold"  # never cut a hash: it is what --tower takes
    for r in rows:
        memory = r["memory"]
        state = f"ok {r['rtt_ms']:.0f} ms" if r["state"] == "ok" else f"{r['state']}: {r['error']}"
        table.add_row(r["name"], r["destination"], state, str(r["hops"]), f"{r['age_s']:.0f}s",
                      f"{r['backend']} ({r['gpus']} x {r['device']})" if r["gpus"] > 1 else f"{r['backend']} ({r['device']})",
                      f"{memory['free_mib']}/{memory['total_mib']} MiB {memory['kind']}",
                      ", ".join([m["alias"] + ("" if m["loaded"] else " (disk)") for m in r["models"]]
                                + [f"{v['alias']} ({v['kind']} {v['realtime']:g}x)" for v in r["voice"]]),
                      f"{r['tokens_per_s']:.0f}")
    out.print(table)

def _print_strangers(rows: list[dict[str, Any]]) -> None:
    table = Table("announced name", "destination", "identity", "models", title="heard, not trusted: never used")
    table.columns[1].overflow = table.columns[2].overflow = "fold"
    for r in rows:
        table.add_row(r["name"], r["destination"], r["identity"] or "?", ", ".join(m["alias"] for m in r["models"]))
    out.print(table)
    out.print("to use one of them (if it is yours): rngrid trust IDENTITY --name NAME")


@main.command()
@client_options
@click.option("-m", "--model", required=True, help="Model alias (or blob id prefix).")
@click.option("--tower", default=None, help="Run on this tower (name or destination hash) instead of routing.")
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.8, show_default=True, type=click.FloatRange(0, 5))
@click.option("--seed", default=None, type=click.IntRange(0, 2**32 - 1))
@click.option("--system", default=None, help="System message (chat models).")
@click.option("--raw", is_flag=True, help="Send the prompt as-is instead of as a chat message.")
@click.option("--adapter", default=None, help="LoRA adapter (alias or blob id), e.g. the --output of a train job.")
@click.option("--adapter-scale", default=1.0, show_default=True, type=click.FloatRange(-10, 10),
              help="LoRA scale; 0 gives the base model.")
@click.option("--busy-wait", default=60.0, show_default=True, type=click.FloatRange(0),
              help="Seconds to keep waiting while every tower is busy: it asks again when a tower announces a "
                   "free slot or queue place or its retry hint has passed, and a last time at the end.")
@click.option("--split", "split_policy", type=click.Choice(["auto", "always", "never", "pipeline", "experts", "tensor"]),
              default="auto", show_default=True, help="Split the model over towers: when no one tower can hold it "
              "and the estimate says it pays (auto), whenever towers are heard (always), never, or always with one "
              "strategy: layers in order (pipeline), an MoE model's experts on the workers (experts), or every "
              "layer across the towers (tensor).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines: {\"text\": ...} per piece, then {\"usage\": ...}.")
@click.argument("prompt")
@click.pass_context
def infer(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, model: str, tower: str | None,
          max_tokens: int, temperature: float, seed: int | None, system: str | None, raw: bool, adapter: str | None,
          adapter_scale: float, busy_wait: float, split_policy: str, as_json: bool, prompt: str) -> None:
    """Run PROMPT on the grid and stream the answer (PROMPT "-" reads standard input)."""
    if prompt == "-":
        prompt = sys.stdin.read()
    from reticulum_grid.split.plan import STRATEGIES
    payload = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
               "split_policy": "always" if split_policy in STRATEGIES else split_policy}
    if split_policy in STRATEGIES:
        payload["placement"] = split_policy
    if adapter:
        payload.update(adapter=adapter, adapter_scale=adapter_scale)
    if raw:
        payload["prompt"] = prompt
    else:
        payload["messages"] = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}]
    grid = open_grid(ctx, connect, rns_config)

    def on_busy(error: WireError, pause_s: float) -> None:  # busy comes before any output, so a retry repeats nothing
        err.print(f"{error.message}; trying again within {pause_s:.1f} s (sooner if a place frees)")

    with reported_errors():
        with ProgressBar(as_json, f"syncing {model}") as progress:
            stream = grid.execute("ai/inference", payload, tower=tower, progress=progress, busy_wait=busy_wait,
                                  on_busy=on_busy)
        _stream(stream, as_json)


def _stream(stream: "Iterable[Text | ToolCallDelta | Usage]", as_json: bool) -> None:
    from reticulum_grid.client import Usage
    for piece in stream:
        if isinstance(piece, Usage):
            if as_json:
                json_line({"usage": dataclasses.asdict(piece)})
            else:
                print(flush=True)
                err.print(piece.summary(), style="dim")
        elif as_json:
            json_line({"text": piece})
        else:
            print(visible(piece), end="", flush=True)


@main.command()
@client_options
@click.option("-m", "--model", default=None, help="Model alias (or blob id prefix).")
@click.option("--adapter", default=None, help="LoRA adapter the request would use.")
@click.option("--simulate", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Plan the split on paper: offers and model from FILE (TOML, or JSON if it ends in .json; "
                   "see docs/split.md), no network.")
@click.option("--split", "strategy", type=click.Choice(["auto", "pipeline", "experts", "tensor"]), default="auto",
              show_default=True, help="The split's strategy, or the planner's pick (auto: each strategy's estimate "
              "for a request of --prompt-tokens and --max-tokens, the fastest kept).")
@click.option("--prompt-tokens", default=100, show_default=True, type=click.IntRange(1),
              help="The request's prompt length the split is planned for.")
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(1))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def route(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, model: str | None,
          adapter: str | None, simulate: str | None, strategy: str, prompt_tokens: int, max_tokens: int,
          as_json: bool) -> None:
    """Show how the grid would rank the towers for MODEL, and why; or, with
    --simulate, the split plan and its estimate for the towers a file describes."""
    if simulate is not None:
        if model or adapter or connect or rns_config:
            fail("--simulate takes the model and the towers from its file: drop -m, --adapter, --connect, --rns-config")
        _simulate(simulate, as_json)
        return
    if model is None:
        fail("give -m MODEL (or --simulate FILE)")
    grid = open_grid(ctx, connect, rns_config)
    try:
        ranked = grid.rank(model, adapter=adapter, complete=True)
    except WireError as e:
        fail(f"{e.code}: {e.message}")
    rows = [{"rank": i + 1, "tower": c.entry.name, "destination": c.entry.hash_hex, **c.reasons,
             "load": {"streams": c.entry.caps.load.streams, "queue": c.entry.caps.load.queue,
                      "jobs": c.entry.caps.load.jobs},
             "tokens_per_s": c.entry.caps.tokens_per_s,
             "believed_tokens_per_s": round(grid.health.believed_tokens_per_s(c.entry.destination_hash,
                                                                              c.entry.caps), 1),
             "measured": grid.health.get(c.entry.destination_hash).tokens_per_s > 0,
             "rtt_ms": round(grid.health.get(c.entry.destination_hash).rtt_s * 1000, 1)}
            for i, c in enumerate(ranked)]
    if adapter and all(r["lacks_adapter"] for r in rows) and grid.local_blob(adapter) is None:
        err.print(f"no tower heard has adapter {adapter!r} and this client has none to send: "
                  "a request with it would fail", style="yellow")
    placement = _split_plan(grid, model, ranked, adapter, strategy, (prompt_tokens, max_tokens))
    single = _best_single(grid, model, ranked) if placement is not None else None
    if as_json:
        json_line(rows)
        if placement is not None:
            json_line({"split": {**placement.to_map(), "rpc": _rpc_paths(grid, placement),
                                 "single": single.to_map() if single else None,
                                 "draft": _draft_gain(grid, model, placement)}})
        return
    table = Table("#", "tower", "model", "why not first", "load", "tok/s", "RTT", "hops", "s/token")
    for r in rows:
        flags = [k.replace("_", " ") for k in ("backed_off", "training", "no_room", "lacks_adapter") if r[k]]
        load = r["load"]
        table.add_row(str(r["rank"]), r["tower"], r["tier"], ", ".join(flags) or "-",
                      f"{load['streams']} running, {load['queue']} queued" + (", training" if load["jobs"] else ""),
                      _rate(r), f"{r['rtt_ms']:.0f} ms", str(r["hops"]), f"{r['cost_s_per_token']:.3f}")
    out.print(table)
    if placement is not None:
        _print_split(placement, _rpc_paths(grid, placement), single)
        _print_draft(_draft_gain(grid, model, placement))


def _rate(row: dict[str, Any]) -> str:
    """The tokens/s routing used, and the tower's claim when that is not what it measured."""
    believed, announced = row["believed_tokens_per_s"], row["tokens_per_s"]
    if row["measured"]:
        return f"{believed:.0f} measured, {announced:.0f} announced"
    return f"{believed:.0f} of {announced:.0f} announced" if believed < announced else f"{announced:.0f} announced"


def _best_single(grid: "Grid", model: str, ranked: "Sequence[Choice]") -> "Estimate | None":
    from reticulum_grid.client import estimates
    need = grid.needs.get(model, 0)
    return estimates.best_single(grid, [c.entry for c in ranked], estimates.read_bytes(grid, model, need), need,
                                 grid.served)


def _draft_gain(grid: "Grid", model: str, placement: "Plan") -> dict[str, Any] | None:
    """The draft the plan's coordinator holds for ``model`` (its caps/full) and
    what it may gain (split/speculation.py ceiling: every drafted token
    accepted), None when it holds none: {"bytes", "draft_max",
    "tokens_per_s_at_most", "gain_at_most"}."""
    from reticulum_grid.split import estimate, speculation
    key = placement.coordinator.offer.key
    draft, entry = grid.drafts.get(key, {}).get(model), grid.table.get(key)
    if not draft or entry is None or placement.estimate is None:
        return None
    rtt = max((p.offer.rtt_s for p in placement.workers), default=0.0)  # the coordinator's, as it chooses
    ahead, most = speculation.ceiling(placement.estimate.tokens_per_s, rtt, draft,
                                      estimate.bandwidth(entry.caps.hardware.backend))
    return {"bytes": draft, "draft_max": ahead, "tokens_per_s_at_most": round(most, 2),
            "gain_at_most": round(most / placement.estimate.tokens_per_s, 2)}


def _print_draft(gain: dict[str, Any] | None) -> None:
    if gain is not None:
        out.print(f"  the coordinator drafts with a {gain['bytes'] / 1e6:.0f} MB model, up to {gain['draft_max']} "
                  f"tokens a verification: at most ~{gain['tokens_per_s_at_most']:.1f} tokens/s "
                  f"({gain['gain_at_most']:.1f}x) when every drafted token is accepted")


def _rpc_paths(grid: "Grid", placement: "Plan") -> dict[str, str]:
    """{worker name: "data plane" | "RNS tunnel"}: how its RPC bytes would travel."""
    coordinator = grid.dataplanes.get(placement.coordinator.offer.key, False)
    return {p.offer.name: "data plane" if coordinator and grid.dataplanes.get(p.offer.key) else "RNS tunnel"
            for p in placement.workers}


def _split_plan(grid: "Grid", model: str, ranked: "Sequence[Choice]", adapter: str | None, strategy: str,
                shape: tuple[int, int]) -> "Plan | None":
    """The split plan a request of ``shape`` (prompt tokens, max_tokens) would
    use when no single tower has room or a ``strategy`` is named (else None)."""
    from reticulum_grid.client.split import make_plan, needs_split
    if adapter or not needs_split(grid, model, ranked, "auto" if strategy == "auto" else "always"):
        return None
    try:
        return make_plan(grid, model, strategy=strategy, shape=shape)[0]
    except WireError as e:
        err.print(f"no single tower has room for {model!r}, and no split fits either: {e.message}", style="yellow")
        return None


def _simulate(path: str, as_json: bool) -> None:
    """Print the plan the planner makes for the towers and model in the file at ``path``."""
    from reticulum_grid.split import simulate
    from reticulum_grid.split.plan import PlanError
    try:
        scenario = simulate.load(path)
        placement = simulate.run(scenario)
    except (simulate.SimulationError, PlanError) as e:
        fail(str(e))
    shape = scenario.shape
    if as_json:
        json_line({"split": {**placement.to_map(), "model": {
            "name": shape.name, "bytes": shape.weight_bytes, "blocks": shape.blocks, "embedding": shape.embedding,
            "context": scenario.context}, "simulated": True}})
        return
    out.print(f"{visible(shape.name)}: {shape.weight_bytes / 1e9:.1f} GB of weights, {shape.blocks} layers, "
              f"needs ~{placement.need_mib} MiB with a {scenario.context}-token context")
    _print_split(placement, {}, None, f"on paper (no network): {len(placement.parts)} tower(s)")
    out.print("  planner's estimate from the file's figures, not a measurement")


def _holds(placement: "Plan", part: "Part") -> str:
    """What ``part`` of ``placement`` holds, in words of its strategy."""
    if placement.strategy == "tensor":
        return f"{part.layers}/{placement.n_layers} of every layer"
    if placement.strategy == "experts":
        return "the rest, every layer" if part is placement.coordinator else \
            next((r.split(": ", 1)[1] for r in placement.reasons if r.startswith(f"{part.offer.name}: experts")),
                 "experts")
    return f"layers {part.first}-{part.end - 1}" + ("" if part is not placement.coordinator else " + output")


def _print_split(placement: "Plan", rpc: dict[str, str], single: "Estimate | None", title: str | None = None) -> None:
    table = Table("tower", "role", "holds", "memory", "RPC", "RTT from coordinator",
                  title=title or f"split over {len(placement.parts)} towers ({placement.strategy})")
    for p in placement.parts:
        worker = p is not placement.coordinator
        table.add_row(p.offer.name, "worker" if worker else "coordinator", _holds(placement, p),
                      f"~{p.mib} of {p.offer.lend_mib} MiB lent", rpc.get(p.offer.name, "-"),
                      f"{p.offer.rtt_s * 1000:.1f} ms" if worker else "-")
    out.print(table)
    for reason in placement.reasons:
        out.print(f"  {reason}")
    if placement.estimate is not None:
        e = placement.estimate
        out.print(f"  estimate split: ~{e.tokens_per_s:.1f} tokens/s, +{e.added_ttft_s * 1000:.0f} ms to the first "
                  "token (over one tower's)")
        if placement.workers:
            out.print(f"  each worker's link carries ~{e.link_bytes_per_token / 1000:.1f} kB per token (both ways)")
    if single is not None:
        slower = placement.estimate is not None and single.tokens_per_s >= placement.estimate.tokens_per_s
        out.print(f"  estimate whole on {visible(single.where)} (partly in RAM): ~{single.tokens_per_s:.1f} tokens/s"
                  + (": faster than the split, so --split auto runs it there" if slower else ""))


@main.command()
@click.option("--prompt", default="Explain in two sentences what a mesh network is.", show_default=True)
@click.option("--max-tokens", default=200, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.7, show_default=True, type=click.FloatRange(0, 2),
              help="0: the same answer every time (greedy).")
def demo(prompt: str, max_tokens: int, temperature: float) -> None:
    """Start a tower and a client on loopback and stream a real answer."""
    from reticulum_grid.demo import run_demo
    try:
        run_demo(prompt, max_tokens, out, err, temperature)
    except WireError as e:
        fail(f"{e.code}: {e.message}")
    except KeyboardInterrupt:
        sys.exit(130)
