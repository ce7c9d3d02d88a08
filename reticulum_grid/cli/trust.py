"""``rngrid trust``, ``untrust``: the towers this client sends prompts and data to."""


import click

from reticulum_grid.node import config as cfg
from reticulum_grid.node import trust as trustlist

from reticulum_grid.cli.common import err, fail, main, out


@main.command()
@click.argument("identity_hash")
@click.option("--name", default=None, help="What this client calls the tower (default: the name it announces).")
@click.pass_context
def trust(ctx: click.Context, identity_hash: str, name: str | None) -> None:
    """Trust the tower with IDENTITY_HASH: this client sends it prompts, datasets,
    adapters and shard plans (``rngrid tower`` prints the line to run)."""
    path = ctx.obj["home"] / "client.toml"
    try:
        named = trustlist.trust(path, identity_hash, name)
    except (cfg.ConfigError, OSError) as e:
        fail(str(e))
    destination = trustlist.tower_destination(cfg.identity_hex(identity_hash)).hex()
    out.print(f"trusting tower {cfg.identity_hex(identity_hash)} (destination {destination}) as "
              + (repr(named) if named else "the name it announces") + f" in {path}")


@main.command()
@click.argument("identity_hash")
@click.pass_context
def untrust(ctx: click.Context, identity_hash: str) -> None:
    """Stop trusting the tower with IDENTITY_HASH (nothing more is sent to it)."""
    path = ctx.obj["home"] / "client.toml"
    try:
        removed = trustlist.untrust(path, identity_hash)
    except (cfg.ConfigError, OSError) as e:
        fail(str(e))
    out.print(f"{identity_hash} {'is no longer trusted' if removed else 'was not trusted'} in {path}")
    if removed:
        err.print("a running gateway or client stops using it at once")
