"""``rngrid tower``, ``transport``, ``id``, ``allow``, ``revoke``: running a tower and its allow-list."""


import logging
import shlex
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from links import commands
from reticulum_grid.node import allowlist
from reticulum_grid.node import config as cfg
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path

from reticulum_grid.cli.common import err, fail, ifac_options, main, out, styled


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Tower config (default HOME/tower/tower.toml; created if missing).")
@click.option("--name", default=None, help="Tower name for a new config (default: this machine's host name).")
@click.option("--listen", default="127.0.0.1:4242", show_default=True, help="TCP listen address for a new config.")
@click.option("--connect", multiple=True, metavar="HOST:PORT", help="Peers for a new config.")
@click.option("--model", "models", multiple=True, metavar="ALIAS=PATH",
              help=f"GGUF model for a new config (repeatable; default: the bundled {DEFAULT_ALIAS}); PATH may "
                   "name another tool's model: ollama:NAME[:TAG], hf:ORG/REPO/FILE.gguf, lmstudio:...")
@click.option("--voice/--no-voice", "voice", default=None,
              help="Serve speech to text (Whisper base) and text to speech (espeak-ng) in a new config "
                   "(default: when both are installed).")
@ifac_options
@click.pass_context
def tower(ctx: click.Context, config_path: str | None, name: str | None, listen: str, connect: tuple[str, ...],
          models: tuple[str, ...], voice: bool | None, network_name: str | None, passphrase: str | None) -> None:
    """Run a tower: serve the models in its config to allowed identities
    (--network-name/--passphrase: a private grid's IFAC, for a new config)."""
    from reticulum_grid.node.identity import IdentityError
    from reticulum_grid.tower import Tower

    logging.getLogger("rngrid").setLevel(min(logging.getLogger().level, logging.INFO))
    path = Path(config_path) if config_path else ctx.obj["home"] / "tower" / "tower.toml"
    if not path.exists():
        _new_tower_config(path, name or _host_name(), listen, connect, models, network_name or "", passphrase or "",
                          voice=_voice_installed() if voice is None else voice)
        err.print(f"wrote new tower config {path}")
    else:
        given = [f"--{p.replace('_', '-')}" for p in ("name", "listen", "connect", "model", "voice", "network_name",
                                                      "passphrase")
                 if ctx.get_parameter_source(p if p != "model" else "models") == click.core.ParameterSource.COMMANDLINE]
        if given:
            err.print(f"{path} exists, so {', '.join(given)} only shape a new config and are ignored; "
                      "edit the file instead", style="yellow")
    try:
        tower = Tower(cfg.load_tower(path))
        tower.start()
    except (cfg.ConfigError, IdentityError, OSError, ValueError) as e:
        fail(str(e))
    # start() set these, or raised.
    assert tower.registry is not None and tower.destination is not None and tower.identity is not None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    voices = [f"{v.alias} ({v.kind})" for v in tower.config.voice]
    serving = ", ".join([*tower.registry.aliases(), *voices]) or "no models"
    err.print(styled("tower ", (tower.config.name, "bold"), f" serving {serving} at {tower.destination.hash.hex()}"))
    err.print(f"on each machine that may use it, run: rngrid trust {tower.identity.hash.hex()} "
              f"--name {shlex.quote(tower.config.name)}")
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
@click.option("--listen", default="127.0.0.1:4242", show_default=True,
              help="TCP listen address (0.0.0.0:PORT, or a tailnet/LAN address, for other machines).")
@click.option("--connect", multiple=True, metavar="HOST:PORT", help="Other nodes to connect to (repeatable).")
@click.option("--link-bitrate", "link_bitrate", default=0, type=click.IntRange(0),
              help="The links' speed as told to RNS (bits/s): at or below 62500 RNS uses its 500-byte MTU and "
                   "paces announces to 2 % of it. It does not limit the rate.")
@ifac_options
@click.pass_context
def transport(ctx: click.Context, config_dir: str | None, listen: str, connect: tuple[str, ...], link_bitrate: int,
              network_name: str | None, passphrase: str | None) -> None:
    """Run an RNS transport node for the grid (forwards announces and links
    between towers and clients that are not directly connected); with
    --network-name/--passphrase only nodes of that private grid get through."""
    from reticulum_grid.node import rnsnet
    directory = Path(config_dir) if config_dir else ctx.obj["home"] / "transport"
    try:
        rnsnet.start(rnsnet.write_config(directory, listen=listen, connect=connect, transport=True,
                                         link_bitrate=link_bitrate, network_name=network_name or "",
                                         passphrase=passphrase or ""))
    except (cfg.ConfigError, OSError) as e:
        fail(str(e))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    err.print(f"transport node listening on {listen}")
    while not stop.wait(1.0):
        pass
    rnsnet.stop()


def _host_name() -> str:
    import socket
    name = socket.gethostname().split(".")[0] or "tower"
    return name.encode()[:cfg.NAME_MAX_BYTES].decode(errors="ignore")


def _voice_installed() -> bool:
    import importlib.util
    import shutil
    return importlib.util.find_spec("faster_whisper") is not None and shutil.which("espeak-ng") is not None


def _new_tower_config(path: Path, name: str, listen: str, connect: Sequence[str], models: Sequence[str],
                      network_name: str = "", passphrase: str = "", voice: bool = False) -> None:
    parsed: dict[str, str] = {}
    for spec in models:
        alias, sep, gguf = spec.partition("=")
        if not sep:
            fail(f"--model wants ALIAS=PATH, got {spec!r}", 2)
        parsed[alias] = gguf if cfg.is_source_ref(gguf) else str(Path(gguf).expanduser().resolve())
    if not parsed:
        parsed = {DEFAULT_ALIAS: default_model_path()}
    sections: dict[str, Any] = ({"voice": {"whisper-base": {"kind": "stt"}, "espeak-ng": {"kind": "tts"}}}
                                if voice else {})
    cfg.write_tower(path, name, parsed, listen=listen, connect=connect, network_name=network_name,
                    passphrase=passphrase, **sections)


@main.command("id")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Show a tower's identity and destination instead of this client's.")
@click.pass_context
def show_id(ctx: click.Context, config_path: str | None) -> None:
    """Print this machine's identity hash (what towers put on their allow-list)."""
    from announce.announcer import tower_destination_hash
    from reticulum_grid.node.identity import IdentityError, load_or_create
    try:
        if config_path:
            ident = load_or_create(Path(config_path).parent / "identity")
            print(f"identity    {ident.hash.hex()}\ndestination {tower_destination_hash(ident).hex()}")
        else:
            print(load_or_create(ctx.obj["home"] / "identity").hash.hex())
    except IdentityError as e:
        fail(str(e))


def roles_help() -> str:
    """Each role and the commands it opens (links/commands.py), for ``rngrid allow --help``."""
    opened = commands.by_role()
    line = lambda role: f"  {role}: {', '.join(opened.get(role, ()))}"
    users = [r for r in cfg.ROLES if r not in cfg.TOWER_ROLES and r != "admin"]
    return ("\n\n\b\nA user's roles:\n" + "\n".join(map(line, users))
            + "\n  admin: all of the above, and every owner's jobs"
            + "\n\n\b\nAnother tower's roles (never a user's; admin does not include them):\n"
            + "\n".join(map(line, cfg.TOWER_ROLES)))


@main.command(help="Let IDENTITY_HASH use a tower with the given roles (takes effect at once)." + roles_help())
@click.argument("identity_hash")
@click.option("--role", "roles", multiple=True, required=True, type=click.Choice(cfg.ROLES),
              help="Role to grant (repeatable).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Tower config to edit (default HOME/tower/tower.toml).")
@click.pass_context
def allow(ctx: click.Context, identity_hash: str, roles: tuple[str, ...], config_path: str | None) -> None:
    path = Path(config_path) if config_path else ctx.obj["home"] / "tower" / "tower.toml"
    try:
        granted = allowlist.allow(path, identity_hash, roles)
    except (cfg.ConfigError, OSError) as e:
        fail(str(e))
    out.print(f"{identity_hash} may now: {', '.join(granted)} on {path}")
    if set(roles) & set(cfg.TOWER_ROLES):
        err.print(f"{' and '.join(r for r in cfg.TOWER_ROLES if r in roles)}: for another tower's identity only "
                  "(rngrid id --config tower.toml on that tower), never a user's; admin does not include it")


@main.command()
@click.argument("identity_hash")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Tower config to edit (default HOME/tower/tower.toml).")
@click.pass_context
def revoke(ctx: click.Context, identity_hash: str, config_path: str | None) -> None:
    """Remove IDENTITY_HASH from a tower's allow-list (takes effect at once)."""
    path = Path(config_path) if config_path else ctx.obj["home"] / "tower" / "tower.toml"
    try:
        removed = allowlist.revoke(path, identity_hash)
    except (cfg.ConfigError, OSError) as e:
        fail(str(e))
    out.print(f"{identity_hash} {'removed from' if removed else 'was not on'} {path}")
