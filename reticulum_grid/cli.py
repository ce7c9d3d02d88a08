"""``rngrid``: the command line. The only module that prints."""

import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from links.wire import Code, WireError
from reticulum_grid import config as cfg
from reticulum_grid.default_model import DEFAULT_ALIAS, default_model_path

# Piped output is read by scripts and people alike: give tables room instead of cutting hashes.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(message, code=1):
    err.print(f"[red]error:[/red] {message}", markup=True)
    sys.exit(code)


def _client_options(f):
    f = click.option("--connect", "connect", multiple=True, metavar="HOST:PORT",
                     help="Tower or transport node to reach over TCP (repeatable). Default: client.toml, else 127.0.0.1:4242.")(f)
    f = click.option("--rns-config", type=click.Path(file_okay=False), default=None,
                     help="Use this existing RNS config directory (e.g. a shared rnsd).")(f)
    return f


def _grid(ctx, connect, rns_config):
    from reticulum_grid.client import Grid
    try:
        return Grid(home=ctx.obj["home"], connect=list(connect) or None, rns_config=rns_config)
    except (cfg.ConfigError, OSError, RuntimeError) as e:
        _fail(str(e))


@click.group()
@click.option("--home", type=click.Path(file_okay=False), default=None, envvar="RNGRID_HOME",
              help="Client home: identity and RNS state (default ~/.rngrid).")
@click.option("-v", "--verbose", count=True, help="-v for progress, -vv for RNS debug logs.")
@click.pass_context
def main(ctx, home, verbose):
    """A GPU grid over Reticulum: run models on whichever of your machines can."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    if home:
        Path(home).mkdir(parents=True, exist_ok=True)
    ctx.obj = {"home": Path(home) if home else cfg.home()}


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Tower config (default HOME/tower/tower.toml; created if missing).")
@click.option("--name", default=None, help="Tower name for a new config (default: this machine's host name).")
@click.option("--listen", default="127.0.0.1:4242", show_default=True, help="TCP listen address for a new config.")
@click.option("--connect", multiple=True, metavar="HOST:PORT", help="Peers for a new config.")
@click.option("--model", "models", multiple=True, metavar="ALIAS=PATH",
              help=f"GGUF model for a new config (repeatable; default: the bundled {DEFAULT_ALIAS}).")
@click.pass_context
def tower(ctx, config_path, name, listen, connect, models):
    """Run a tower: serve the models in its config to allowed identities."""
    from reticulum_grid.identity import IdentityError
    from reticulum_grid.tower import Tower

    logging.getLogger("rngrid").setLevel(min(logging.getLogger().level, logging.INFO))
    path = Path(config_path) if config_path else ctx.obj["home"] / "tower" / "tower.toml"
    if not path.exists():
        _new_tower_config(path, name or _host_name(), listen, connect, models)
        err.print(f"wrote new tower config {path}")
    else:
        given = [f"--{p}" for p in ("name", "listen", "connect", "model")
                 if ctx.get_parameter_source(p if p != "model" else "models") == click.core.ParameterSource.COMMANDLINE]
        if given:
            err.print(f"{path} exists, so {', '.join(given)} only shape a new config and are ignored; "
                      "edit the file instead", style="yellow")
    try:
        tower = Tower(cfg.load_tower(path))
        tower.start()
    except (cfg.ConfigError, IdentityError, OSError, ValueError) as e:
        _fail(str(e))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    err.print(f"tower [bold]{tower.config.name}[/bold] serving {', '.join(tower.registry.aliases()) or 'no models'} "
              f"at {tower.destination.hash.hex()}", markup=True)
    listen = tower.config.network.listen
    if listen.startswith("127."):
        port = listen.rsplit(":", 1)[1]
        err.print(f"listening on {listen} only: other machines reach this tower once [network] listen in {path} "
                  f"is 0.0.0.0:{port} (or this machine's tailnet/LAN address)", markup=False)
    while not stop.wait(1.0):
        pass
    tower.stop()


@main.command()
@click.option("--config-dir", type=click.Path(file_okay=False), default=None,
              help="RNS config directory to write and use (default HOME/transport).")
@click.option("--listen", default="0.0.0.0:4242", show_default=True, help="TCP listen address.")
@click.option("--connect", multiple=True, metavar="HOST:PORT", help="Other nodes to connect to (repeatable).")
@click.option("--bitrate", default=0, type=click.IntRange(0), help="Emulate a slow link (bits/s).")
@click.pass_context
def transport(ctx, config_dir, listen, connect, bitrate):
    """Run an RNS transport node for the grid (forwards announces and links
    between towers and clients that are not directly connected)."""
    from reticulum_grid import rnsnet
    directory = Path(config_dir) if config_dir else ctx.obj["home"] / "transport"
    try:
        rnsnet.start(rnsnet.write_config(directory, listen=listen, connect=connect, transport=True, bitrate=bitrate))
    except (cfg.ConfigError, OSError) as e:
        _fail(str(e))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    err.print(f"transport node listening on {listen}")
    while not stop.wait(1.0):
        pass
    rnsnet.stop()


def _host_name():
    import socket
    name = socket.gethostname().split(".")[0] or "tower"
    return name.encode()[:cfg.NAME_MAX_BYTES].decode(errors="ignore")


def _new_tower_config(path, name, listen, connect, models):
    parsed = {}
    for spec in models:
        alias, sep, gguf = spec.partition("=")
        if not sep:
            _fail(f"--model wants ALIAS=PATH, got {spec!r}", 2)
        parsed[alias] = str(Path(gguf).expanduser().resolve())
    if not parsed:
        parsed = {DEFAULT_ALIAS: default_model_path()}
    cfg.write_tower(path, name, parsed, listen=listen, connect=connect)


@main.command()
@_client_options
@click.option("--wait", default=5.0, show_default=True, help="Seconds to listen for towers.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def towers(ctx, connect, rns_config, wait, as_json):
    """List the towers heard on the grid."""
    grid = _grid(ctx, connect, rns_config)
    entries = grid.towers(wait=wait)
    rows = [_tower_row(e) for e in entries]
    if as_json:
        out.print_json(json.dumps(rows))
        return
    if not rows:
        err.print(f"no towers heard within {wait:.0f} s")
        sys.exit(1)
    table = Table("name", "destination", "hops", "age", "backend", "memory free/total", "models", "tok/s")
    table.columns[1].overflow = "fold"  # never cut a hash: it is what --tower takes
    for r in rows:
        kind = "VRAM" if r["vram_total_mib"] else "RAM"
        free, total = (r["vram_free_mib"], r["vram_total_mib"]) if r["vram_total_mib"] else (
            r["ram_free_mib"], r["ram_total_mib"])
        table.add_row(r["name"], r["destination"], str(r["hops"]), f"{r['age_s']:.0f}s",
                      f"{r['backend']} ({r['device']})", f"{free}/{total} MiB {kind}",
                      ", ".join(m["alias"] + ("" if m["loaded"] else " (disk)") for m in r["models"]),
                      f"{r['tokens_per_s']:.0f}")
    out.print(table)


def _tower_row(entry):
    hw = entry.caps.hardware
    return {"name": entry.name, "destination": entry.hash_hex, "hops": entry.hops, "age_s": round(entry.age(), 1),
            "backend": hw.backend, "device": hw.device, "vram_free_mib": hw.vram_free_mib,
            "vram_total_mib": hw.vram_total_mib, "ram_free_mib": hw.ram_free_mib, "ram_total_mib": hw.ram_total_mib,
            "models": [{"alias": m.alias, "blob": m.short_hex, "loaded": m.loaded} for m in entry.caps.models],
            "tokens_per_s": entry.caps.tokens_per_s,
            "load": {"streams": entry.caps.load.streams, "jobs": entry.caps.load.jobs, "queue": entry.caps.load.queue}}


@main.command()
@_client_options
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
              help="Seconds to keep retrying while every tower is busy (as each tower's retry hint says).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines: {\"text\": ...} per piece, then {\"usage\": ...}.")
@click.argument("prompt")
@click.pass_context
def infer(ctx, connect, rns_config, model, tower, max_tokens, temperature, seed, system, raw, adapter, adapter_scale,
          busy_wait, as_json, prompt):
    """Run PROMPT on the grid and stream the answer (PROMPT "-" reads standard input)."""
    if prompt == "-":
        prompt = sys.stdin.read()
    payload = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
    if adapter:
        payload.update(adapter=adapter, adapter_scale=adapter_scale)
    if raw:
        payload["prompt"] = prompt
    else:
        payload["messages"] = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}]
    grid = _grid(ctx, connect, rns_config)
    deadline = time.monotonic() + busy_wait
    try:
        while True:
            try:
                with _progress(as_json, f"syncing {model}") as progress:
                    stream = grid.execute("ai/inference", payload, tower=tower, progress=progress)
                _stream(stream, as_json)
                return
            except WireError as e:  # busy comes before any output, so a retry repeats nothing
                pause = max(1.0, e.retry_after or 0.0)
                if e.code != Code.BUSY or time.monotonic() + pause > deadline:
                    raise
                err.print(f"{e.message}; trying again in {pause:.0f} s")
                time.sleep(pause)
    except WireError as e:
        _fail(f"{e.code}: {e.message}")
    except KeyboardInterrupt:
        err.print("\ncancelled")
        sys.exit(130)


def _stream(stream, as_json):
    from reticulum_grid.client import Usage
    for piece in stream:
        if isinstance(piece, Usage):
            if as_json:
                print(json.dumps({"usage": piece.__dict__}), flush=True)
            else:
                print(flush=True)
                err.print(f"[dim]{piece.completion_tokens} tokens from {piece.tower}, TTFT {piece.ttft_s * 1000:.0f} ms, "
                          f"{piece.tokens_per_s:.1f} tokens/s, finish: {piece.finish_reason}[/dim]", markup=True)
        elif as_json:
            print(json.dumps({"text": piece}), flush=True)
        else:
            print(piece, end="", flush=True)


@main.command()
@_client_options
@click.option("-m", "--model", required=True, help="Model alias (or blob id prefix).")
@click.option("--adapter", default=None, help="LoRA adapter the request would use.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def route(ctx, connect, rns_config, model, adapter, as_json):
    """Show how the grid would rank the towers for MODEL, and why."""
    grid = _grid(ctx, connect, rns_config)
    try:
        ranked = grid.rank(model, adapter=adapter)
    except WireError as e:
        _fail(f"{e.code}: {e.message}")
    rows = [{"rank": i + 1, "tower": c.entry.name, "destination": c.entry.hash_hex, **c.reasons,
             "load": {"streams": c.entry.caps.load.streams, "queue": c.entry.caps.load.queue,
                      "jobs": c.entry.caps.load.jobs},
             "tokens_per_s": c.entry.caps.tokens_per_s,
             "rtt_ms": round(grid.health.get(c.entry.destination_hash).rtt_s * 1000, 1)}
            for i, c in enumerate(ranked)]
    if adapter and all(r["lacks_adapter"] for r in rows) and grid.local_blob(adapter) is None:
        err.print(f"no tower heard has adapter {adapter!r} and this client has none to send: "
                  "a request with it would fail", style="yellow")
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("#", "tower", "model", "why not first", "load", "tok/s", "RTT", "hops", "s/token")
    for r in rows:
        flags = [k.replace("_", " ") for k in ("backed_off", "training", "no_room", "lacks_adapter") if r[k]]
        load = r["load"]
        table.add_row(str(r["rank"]), r["tower"], r["tier"], ", ".join(flags) or "-",
                      f"{load['streams']} running, {load['queue']} queued" + (", training" if load["jobs"] else ""),
                      f"{r['tokens_per_s']:.0f}", f"{r['rtt_ms']:.0f} ms", str(r["hops"]), f"{r['cost_s_per_token']:.3f}")
    out.print(table)


@main.command("id")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Show a tower's identity and destination instead of this client's.")
@click.pass_context
def show_id(ctx, config_path):
    """Print this machine's identity hash (what towers put on their allow-list)."""
    from announce.announcer import tower_destination_hash
    from reticulum_grid.identity import IdentityError, load_or_create
    try:
        if config_path:
            ident = load_or_create(Path(config_path).parent / "identity")
            print(f"identity    {ident.hash.hex()}\ndestination {tower_destination_hash(ident).hex()}")
        else:
            print(load_or_create(ctx.obj["home"] / "identity").hash.hex())
    except IdentityError as e:
        _fail(str(e))


@main.command()
@click.argument("identity_hash")
@click.option("--role", "roles", multiple=True, required=True, type=click.Choice(cfg.ROLES),
              help="Role to grant (repeatable).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Tower config to edit (default HOME/tower/tower.toml).")
@click.pass_context
def allow(ctx, identity_hash, roles, config_path):
    """Let IDENTITY_HASH use a tower with the given roles (takes effect at once)."""
    path = Path(config_path) if config_path else ctx.obj["home"] / "tower" / "tower.toml"
    try:
        granted = cfg.allow(path, identity_hash, roles)
    except (cfg.ConfigError, OSError) as e:
        _fail(str(e))
    out.print(f"{identity_hash} may now: {', '.join(granted)} on {path}")


@main.command()
@click.argument("identity_hash")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Tower config to edit (default HOME/tower/tower.toml).")
@click.pass_context
def revoke(ctx, identity_hash, config_path):
    """Remove IDENTITY_HASH from a tower's allow-list (takes effect at once)."""
    path = Path(config_path) if config_path else ctx.obj["home"] / "tower" / "tower.toml"
    try:
        removed = cfg.revoke(path, identity_hash)
    except (cfg.ConfigError, OSError) as e:
        _fail(str(e))
    out.print(f"{identity_hash} {'removed from' if removed else 'was not on'} {path}")


@main.command()
@click.option("--prompt", default="Explain in two sentences what a mesh network is.", show_default=True)
@click.option("--max-tokens", default=200, show_default=True, type=click.IntRange(1))
def demo(prompt, max_tokens):
    """Start a tower and a client on loopback and stream a real answer."""
    from reticulum_grid.demo import run_demo
    try:
        run_demo(prompt, max_tokens, out, err)
    except WireError as e:
        _fail(f"{e.code}: {e.message}")
    except KeyboardInterrupt:
        sys.exit(130)


class _progress:
    """A progress callback ``(done_bytes, total_bytes)`` shown as a bar with rate
    and ETA on stderr (JSON lines on stdout with --json); silent until called."""

    def __init__(self, as_json, label):
        self.as_json = as_json
        self.label = label
        self._bar = None
        self._task = None

    def __enter__(self):
        return self

    def __call__(self, done, total):
        if self.as_json:
            print(json.dumps({"progress": {"done_bytes": done, "total_bytes": total}}), flush=True)
            return
        if self._bar is None:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(), console=err)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=total)
        self._bar.update(self._task, completed=done, total=total)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()


@main.group(invoke_without_command=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Use this tower's store instead of the client's.")
@click.option("--wait", default=3.0, show_default=True, help="Seconds to listen for towers (0: do not ask the grid).")
@_client_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def models(ctx, config_path, wait, connect, rns_config, as_json):
    """List the blobs (models, adapters, datasets) in the local store and the
    towers that hold them."""
    ctx.obj["store"] = _store(ctx, config_path)
    if ctx.invoked_subcommand is not None:
        return
    towers = _grid(ctx, connect, rns_config).towers(wait=wait) if wait > 0 and not config_path else []
    rows = [{"aliases": i.aliases, "blob_id": i.hex, "size": i.size, "kind": i.kind, "path": str(i.path),
             "external": i.external, "towers": _holders(i.blob_id, towers)} for i in ctx.obj["store"].list()]
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("alias", "blob id", "kind", "size", "file", "on towers")
    table.columns[1].overflow = "fold"
    for r in rows:
        table.add_row(", ".join(r["aliases"]) or "-", r["blob_id"], r["kind"], _mib(r["size"]),
                      r["path"] + (" (in place)" if r["external"] else ""),
                      ", ".join(f"{t['name']} ({t['state']})" for t in r["towers"]) or "-")
    out.print(table)


def _holders(blob_id, towers):
    """Towers whose caps list ``blob_id``, with "loaded" or "on disk"."""
    found = []
    for entry in towers:
        for m in entry.caps.models + entry.caps.adapters:
            if m.short_id == blob_id[:len(m.short_id)]:
                found.append({"name": entry.name, "state": "loaded" if getattr(m, "loaded", False) else "on disk"})
    return found


def _store(ctx, config_path):
    from reticulum_grid.blobstore import BlobStore
    if config_path:
        return BlobStore(Path(config_path).parent / "blobs")
    return BlobStore(ctx.obj["home"] / "blobs")


def _mib(size):
    return f"{size / 2**20:.1f} MiB"


@models.command("add")
@click.argument("path", type=click.Path(dir_okay=False, exists=True))
@click.option("--alias", required=True, help="Name to use for it (e.g. coder-32b).")
@click.option("--kind", type=click.Choice(["model", "adapter", "dataset", "file"]), default=None,
              help="Default: from the file (GGUF model or adapter, .jsonl dataset, else file).")
@click.option("--copy", is_flag=True, help="Copy the file into the store instead of referencing it in place.")
@click.pass_context
def models_add(ctx, path, alias, kind, copy):
    """Add a file to the store as a blob named by its BLAKE3 manifest hash."""
    from reticulum_grid.gguf_info import file_kind
    try:
        kind = kind or file_kind(path)
        info = ctx.obj["store"].add_file(path, alias=alias, kind=kind, copy=copy)
    except WireError as e:
        _fail(f"{e.code}: {e.message}")
    except ValueError as e:  # a file with the GGUF magic that the gguf library cannot read
        _fail(f"{path}: {e}")
    out.print(f"{alias} -> {info.hex} ({_mib(info.size)}, {info.kind})")


@models.command("rm")
@click.argument("name")
@click.pass_context
def models_rm(ctx, name):
    """Forget an alias (or a blob id); a blob left without aliases is deleted
    (a file referenced in place is only forgotten)."""
    try:
        gone = ctx.obj["store"].remove(name)
    except WireError as e:
        _fail(f"{e.code}: {e.message}")
    out.print(f"removed {name}" + (f"; deleted blob {gone[0].hex()}" if gone else "; the blob keeps its other aliases"))


@main.command()
@_client_options
@click.argument("name")
@click.option("--from", "from_tower", default=None, help="Fetch from this tower only (default: every tower that has it).")
@click.option("--alias", default=None, help="Alias in the local store (default: NAME).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines (progress, then the report).")
@click.pass_context
def pull(ctx, connect, rns_config, name, from_tower, alias, as_json):
    """Fetch a blob (alias or blob id) into the local store, from several towers at once."""
    grid = _grid(ctx, connect, rns_config)
    info, report = _transfer(as_json, f"pull {name}",
                             lambda progress: grid.pull(name, from_tower=from_tower, alias=alias, progress=progress))
    _report(report.to_map(), as_json, f"{', '.join(info.aliases) or info.hex} is in {info.path}")


@main.command()
@_client_options
@click.argument("name")
@click.option("--to", "to_tower", required=True, help="Tower name or destination hash.")
@click.option("--alias", default=None, help="Alias on the tower (default: the local alias).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines (progress, then the report).")
@click.pass_context
def push(ctx, connect, rns_config, name, to_tower, alias, as_json):
    """Send a blob from the local store to a tower (needs the sync role there)."""
    grid = _grid(ctx, connect, rns_config)
    report = _transfer(as_json, f"push {name}", lambda progress: grid.push(name, to_tower, alias=alias,
                                                                          progress=progress))
    _report(report, as_json, f"{name} is on {to_tower}")


def _transfer(as_json, label, run):
    """``run(progress)`` with a progress bar; a WireError ends the command."""
    try:
        with _progress(as_json, label) as progress:
            return run(progress)
    except WireError as e:
        _fail(f"{e.code}: {e.message}")


def _report(report, as_json, summary):
    if as_json:
        print(json.dumps({"report": report}), flush=True)
        return
    fetched = sum(report.get("fetched", {}).values())
    sources = ", ".join(f"{k}: {v}" for k, v in report.get("fetched", {}).items()) or "none"
    err.print(f"{summary}: {report.get('chunks', 0)} chunks, {report.get('reused', 0)} already here, "
              f"{fetched} fetched ({sources}) in {report.get('seconds', 0):.1f} s")
    for name in report.get("lying_sources", []):
        err.print(f"[yellow]warning:[/yellow] {name} served data that failed verification; it was dropped", markup=True)


@main.command()
@_client_options
@click.option("--base", required=True, help="Base model alias (or blob id).")
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False, exists=True),
              help="Training data: JSONL of {\"messages\": [...]} or {\"text\": ...} lines.")
@click.option("--output", "output_alias", required=True, help="Alias of the adapter this job produces.")
@click.option("--tower", default="auto", show_default=True, help="Tower name or hash, or auto.")
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
@click.option("--notify", default=None, help="LXMF address for the result (default: this identity's).")
@click.option("--detach", is_flag=True, help="Print the job id and return instead of watching.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.pass_context
def train(ctx, connect, rns_config, base, data_path, output_alias, tower, target_modules, detach, as_json, **options):
    """Start LoRA fine-tuning on a tower; it keeps running if you leave."""
    request = {"base": base, "dataset": "", "output_alias": output_alias,
               "target_modules": [t.strip() for t in target_modules.split(",") if t.strip()],
               **{k: v for k, v in options.items() if v is not None}}
    grid = _grid(ctx, connect, rns_config)
    entry, job_id = _transfer(as_json, "sending", lambda progress: grid.train(request, data_path, tower, progress))
    if as_json:
        print(json.dumps({"job_id": job_id, "tower": entry.name}), flush=True)
    else:
        err.print(f"job [bold]{job_id}[/bold] on {entry.name}; watch it with: rngrid jobs watch {job_id}", markup=True)
        if detach:
            print(job_id, flush=True)  # stdout, for JOB=$(rngrid train ... --detach)
    if not detach:
        _watch(grid, job_id, entry.name, as_json)


@main.group(invoke_without_command=True)
@_client_options
@click.option("--tower", default=None, help="Only this tower.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def jobs(ctx, connect, rns_config, tower, as_json):
    """List your training jobs (watch and cancel them with the subcommands)."""
    ctx.obj["client"] = (connect, rns_config)
    if ctx.invoked_subcommand is not None:
        return
    grid = _grid(ctx, connect, rns_config)
    try:
        rows = grid.jobs(tower)
    except WireError as e:
        _fail(f"{e.code}: {e.message}")
    if as_json:
        out.print_json(json.dumps([{"tower": name, **job} for name, job in rows]))
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
def jobs_watch(ctx, job_id, tower, as_json):
    """Follow a job's progress (from any client, as often as you like)."""
    _watch(_grid(ctx, *ctx.obj["client"]), job_id, tower, as_json)


@jobs.command("cancel")
@click.argument("job_id")
@click.option("--tower", default=None)
@click.pass_context
def jobs_cancel(ctx, job_id, tower):
    """Cancel a queued or running job."""
    try:
        job = _grid(ctx, *ctx.obj["client"]).cancel_job(job_id, tower)
    except WireError as e:
        _fail(f"{e.code}: {e.message}")
    err.print(f"job {job_id}: {job['state']}" + ("" if job["state"] == "cancelled" else ", cancel requested"))


def _watch(grid, job_id, tower, as_json):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )
    end = None
    bar = None if as_json else Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                        TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=err)
    try:
        events = grid.watch(job_id, tower)  # finds the job's tower first: no bar for an unknown job
        if bar:
            bar.start()
            task = bar.add_task(f"job {job_id}", total=None, info="")
        for event in events:
            if as_json:
                print(json.dumps(event), flush=True)
            elif event["type"] == "started" and event.get("truncated"):
                err.print(f"{event['truncated']} of {event.get('examples')} examples are longer than --seq-len "
                          f"{event.get('seq_len')} tokens and are cut: what comes after is not learned", style="yellow")
            elif event["type"] == "progress":
                bar.update(task, completed=event["step"], total=event["total_steps"],
                           info=f"loss {event['loss']:.4f}  lr {event['lr']:.2e}  {event['tokens_per_s']:.0f} tok/s")
            if event["type"] == "end":
                end = event
                if bar and event.get("total_steps"):
                    bar.update(task, completed=event.get("step") or 0, total=event["total_steps"])
    except WireError as e:
        _fail(f"{e.code}: {e.message}")
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


@main.command()
@_client_options
@click.option("--wait", default=10.0, show_default=True, help="Seconds to listen for messages.")
@click.option("--from", "from_tower", default=None, help="Also collect messages kept for us on this tower.")
@click.option("--count", default=None, type=click.IntRange(1), help="Stop after this many messages.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.pass_context
def inbox(ctx, connect, rns_config, wait, from_tower, count, as_json):
    """Receive LXMF messages (job notifications) for this identity."""
    import queue

    import RNS

    from reticulum_grid.notify import Inbox
    grid = _grid(ctx, connect, rns_config)
    box = Inbox(grid.identity, ctx.obj["home"] / "lxmf")
    if not as_json:
        err.print(f"LXMF address {box.destination.hash.hex()}; listening {wait:.0f} s")
    if from_tower:
        try:
            entry = grid.find_tower(from_tower)
        except WireError as e:
            _fail(f"{e.code}: {e.message}")
        if not box.sync_from(RNS.Identity.recall(entry.destination_hash)):
            err.print(f"[yellow]could not collect from {entry.name}: it runs no propagation node "
                      "or did not answer; still listening[/yellow]")
    deadline, received = time.monotonic() + wait, 0
    while (left := deadline - time.monotonic()) > 0 and received != count:
        try:
            message = box.messages.get(timeout=left)
        except queue.Empty:
            break
        received += 1
        if as_json:
            print(json.dumps(message), flush=True)
        else:
            out.print(f"[bold]{message['title']}[/bold]\n{message['content']}\n", markup=True)
