"""``rngrid models``, ``pull``, ``push``: the blob store and its sync."""


import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from links.wire import WireError

from reticulum_grid.cli.common import json_line, with_progress, client_options, err, fail, main, open_grid, out, styled
from reticulum_grid.store.sync import MAX_TRANSFER_S

if TYPE_CHECKING:  # imported where used
    from announce.table import TowerEntry
    from reticulum_grid.store.blobstore import BlobStore
    from reticulum_grid.store.importing import Candidate


@main.group(invoke_without_command=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Use this tower's store instead of the client's.")
@click.option("--wait", default=3.0, show_default=True, help="Seconds to listen for towers (0: do not ask the grid).")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def models(ctx: click.Context, config_path: str | None, wait: float, connect: tuple[str, ...], rns_config: str | None,
           as_json: bool) -> None:
    """List the blobs (models, adapters, datasets) in the local store and the
    towers that hold them."""
    ctx.obj["store"] = _store(ctx, config_path)
    ctx.obj["tower_config"] = config_path
    if ctx.invoked_subcommand is not None:
        return
    towers = open_grid(ctx, connect, rns_config).towers(wait=wait) if wait > 0 and not config_path else []
    rows = [{"aliases": i.aliases, "blob_id": i.hex, "size": i.size, "kind": i.kind, "path": str(i.path),
             "external": i.external, "towers": _holders(i.blob_id, towers)} for i in ctx.obj["store"].list()]
    if as_json:
        json_line(rows)
        return
    table = Table("alias", "blob id", "kind", "size", "file", "on towers")
    table.columns[1].overflow = "fold"
    for r in rows:
        table.add_row(", ".join(r["aliases"]) or "-", r["blob_id"], r["kind"], _mib(r["size"]),
                      r["path"] + (" (in place)" if r["external"] else ""),
                      ", ".join(f"{t['name']} ({t['state']})" for t in r["towers"]) or "-")
    out.print(table)
    for b in ctx.obj["store"].broken():
        err.print(styled(("not served:", "yellow"), f" {', '.join(b.aliases) or b.hex}: {b.problem}"))


def _holders(blob_id: bytes, towers: "Sequence[TowerEntry]") -> list[dict[str, str]]:
    """Towers whose caps list ``blob_id``, with "loaded" or "on disk"."""
    found = []
    for entry in towers:
        for m in entry.caps.models + entry.caps.adapters:
            if m.short_id == blob_id[:len(m.short_id)]:
                found.append({"name": entry.name, "state": "loaded" if getattr(m, "loaded", False) else "on disk"})
    return found


def _store(ctx: click.Context, config_path: str | None) -> "BlobStore":
    from reticulum_grid.store.blobstore import BlobStore
    if config_path:
        return BlobStore(Path(config_path).parent / "blobs")
    return BlobStore(ctx.obj["home"] / "blobs")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


@models.command("add")
@click.argument("path", type=click.Path(dir_okay=False, exists=True))
@click.option("--alias", required=True, help="Name to use for it (e.g. coder-32b).")
@click.option("--kind", type=click.Choice(["model", "adapter", "dataset", "file"]), default=None,
              help="Default: from the file (GGUF model or adapter, .jsonl dataset, else file).")
@click.option("--copy", is_flag=True, help="Copy the file into the store instead of referencing it in place.")
@click.pass_context
def models_add(ctx: click.Context, path: str, alias: str, kind: str | None, copy: bool) -> None:
    """Add a file to the store as a blob named by its BLAKE3 manifest hash."""
    from reticulum_grid.store.gguf_info import file_kind
    try:
        kind = kind or file_kind(path)
        info = ctx.obj["store"].add_file(path, alias=alias, kind=kind, copy=copy)
    except WireError as e:
        fail(f"{e.code}: {e.message}")
    except ValueError as e:  # a file with the GGUF magic that the gguf library cannot read
        fail(f"{path}: {e}")
    out.print(f"{alias} -> {info.hex} ({_mib(info.size)}, {info.kind})")


@models.command("import")
@click.argument("source", required=False)
@click.option("--alias", default=None, help="Name to use for it (default: the name its tool uses).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def models_import(ctx: click.Context, source: str | None, alias: str | None, as_json: bool) -> None:
    """Without SOURCE (or with a folder): list the GGUF models Ollama, the
    Hugging Face cache and LM Studio keep here (or the folder's), with size,
    architecture, quantisation and whether this llama.cpp loads them.
    With SOURCE (ollama:NAME[:TAG], hf:ORG/REPO/FILE.gguf,
    lmstudio:PUBLISHER/MODEL/FILE.gguf or a GGUF path): register it in place,
    without a copy, under the name its tool uses, in the store of the tower
    HOME/tower/tower.toml (or of `rngrid models --config`)."""
    from reticulum_grid.store import foreign, importing
    if source is None or Path(source).expanduser().is_dir():
        found = foreign.scan(foreign.roots()) if source is None else foreign.scan_dir(Path(source).expanduser())
        _list_found([importing.describe(f) for f in found], as_json)
        return
    store = ctx.obj["store"] if ctx.obj["tower_config"] else _tower_store(ctx)
    try:
        candidate = importing.describe(foreign.resolve(source, foreign.roots()))
        info = importing.register(store, candidate, alias)
    except foreign.SourceError as e:
        fail(str(e))
    except WireError as e:
        fail(f"{e.code}: {e.message}")
    if as_json:
        json_line({**_found_row(candidate), "aliases": info.aliases, "blob_id": info.hex, "store": str(store.root)})
        return
    out.print(f"{alias or candidate.found.name} -> {info.hex} ({_mib(info.size)}, {candidate.architecture} "
              f"{candidate.quantization or ''}) in place at {info.path}; store {store.root}")


def _tower_store(ctx: click.Context) -> "BlobStore":
    from reticulum_grid.store.blobstore import BlobStore
    return BlobStore(ctx.obj["home"] / "tower" / "blobs")


def _found_row(c: "Candidate") -> dict[str, Any]:
    f = c.found
    return {"source": f.source, "ref": f.ref, "name": f.name, "path": str(f.path) if f.path else None,
            "size": f.size, "architecture": c.architecture, "quantization": c.quantization, "loadable": c.loadable,
            "problem": c.problem}


def _list_found(candidates: "Sequence[Candidate]", as_json: bool) -> None:
    from reticulum_grid.store.names import alias_problem
    rows = [_found_row(c) for c in candidates]
    if as_json:
        json_line(rows)
        return
    table = Table("name", "import with", "size", "architecture", "quant", "llama.cpp", "note")
    table.columns[1].overflow = "fold"  # copied into a command: never cut
    for r in rows:
        note = r["problem"] or ("needs --alias (the name is not a usable alias)" if alias_problem(r["name"]) else "")
        loads = {True: "yes", False: "no", None: "?"}[r["loadable"]]
        table.add_row(r["name"], r["ref"], _mib(r["size"]), r["architecture"] or "-", r["quantization"] or "-",
                      loads, note)
    out.print(table if rows else "no GGUF models found (Ollama, Hugging Face cache, LM Studio)")


@models.command("rm")
@click.argument("name")
@click.pass_context
def models_rm(ctx: click.Context, name: str) -> None:
    """Forget an alias (or a blob id); a blob left without aliases is deleted
    (a file referenced in place is only forgotten)."""
    try:
        gone = ctx.obj["store"].remove(name)
    except WireError as e:
        fail(f"{e.code}: {e.message}")
    out.print(f"removed {name}" + (f"; deleted blob {gone[0].hex()}" if gone else "; the blob keeps its other aliases"))


def _transfer_options(alias_help: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """pull's and push's own options: ``--alias`` (``alias_help``), ``--json`` and
    ``--force``, which the command gets as ``max_seconds``: None with --force,
    else MAX_TRANSFER_S (a slower estimate is refused on a radio-class link)."""
    def wrap(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def run(*args: Any, force: bool, **kwargs: Any) -> None:
            command(*args, max_seconds=None if force else MAX_TRANSFER_S, **kwargs)

        run = click.option("--force", is_flag=True,
                           help="Transfer even when the link's measured rate says it takes too long.")(run)
        run = click.option("--json", "as_json", is_flag=True, help="Print JSON lines (progress, then the report).")(run)
        return click.option("--alias", default=None, help=alias_help)(run)

    return wrap


@main.command()
@client_options
@click.argument("name")
@click.option("--from", "from_tower", default=None, help="Fetch from this tower only (default: every tower that has it).")
@_transfer_options("Alias in the local store (default: NAME).")
@click.pass_context
def pull(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, name: str, from_tower: str | None,
         alias: str | None, as_json: bool, max_seconds: float | None) -> None:
    """Fetch a blob (alias or blob id) into the local store, from several towers at once.
    On a radio-class link it is refused when the estimate exceeds 10 minutes, unless --force."""
    grid = open_grid(ctx, connect, rns_config)
    info, report = with_progress(as_json, f"pull {name}", lambda progress: grid.pull(
        name, from_tower=from_tower, alias=alias, progress=progress, max_seconds=max_seconds))
    if info is None:  # fetched and verified, then removed (rngrid models rm) before it could be read back
        fail(f"{name} was fetched but is no longer in the local store")
    _report(report.to_map(), as_json, f"{', '.join(info.aliases) or info.hex} is in {info.path}")


@main.command()
@client_options
@click.argument("name")
@click.option("--to", "to_tower", required=True, help="Tower name or destination hash.")
@_transfer_options("Alias on the tower (default: the local alias).")
@click.pass_context
def push(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, name: str, to_tower: str,
         alias: str | None, as_json: bool, max_seconds: float | None) -> None:
    """Send a blob from the local store to a tower (needs the sync role there).
    On a radio-class link it is refused when the estimate exceeds 10 minutes, unless --force."""
    grid = open_grid(ctx, connect, rns_config)
    report = with_progress(as_json, f"push {name}", lambda progress: grid.push(name, to_tower, alias=alias,
                                                                          progress=progress, max_seconds=max_seconds))
    _report(report, as_json, f"{name} is on {to_tower}")


def _report(report: dict[str, Any], as_json: bool, summary: str) -> None:
    if as_json:
        json_line({"report": report})
        return
    fetched = sum(report.get("fetched", {}).values())
    sources = ", ".join(f"{k}: {v}" for k, v in report.get("fetched", {}).items()) or "none"
    err.print(f"{summary}: {report.get('chunks', 0)} chunks, {report.get('reused', 0)} already here, "
              f"{fetched} fetched ({sources}) in {report.get('seconds', 0):.1f} s")
    for name in report.get("lying_sources", []):
        err.print(styled(("warning:", "yellow"), f" {name} served data that failed verification; it was dropped"))
