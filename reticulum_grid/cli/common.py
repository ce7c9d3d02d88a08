"""Shared pieces of the ``rngrid`` command: the click group, consoles, errors, client options, progress."""


import json
import logging
import sys
import threading
from pathlib import Path

import click
from rich.console import Console

from links.wire import WireError
from reticulum_grid.node import config as cfg

# Piped output is read by scripts and people alike: give tables room instead of cutting hashes.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)



_stdout_lock = threading.Lock()


def json_line(obj):
    """Print ``obj`` as one JSON document on one line of stdout, whole even
    when several threads print at once (a pull's sources report progress from
    their own threads). Every ``--json`` writer prints through this."""
    line = json.dumps(obj) + "\n"
    with _stdout_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def fail(message, code=1):
    err.print(f"[red]error:[/red] {message}", markup=True)
    sys.exit(code)


def client_options(f):
    f = click.option("--connect", "connect", multiple=True, metavar="HOST:PORT",
                     help="Tower or transport node to reach over TCP (repeatable). Default: client.toml, else 127.0.0.1:4242.")(f)
    f = click.option("--rns-config", type=click.Path(file_okay=False), default=None,
                     help="Use this existing RNS config directory (e.g. a shared rnsd).")(f)
    return f


def open_grid(ctx, connect, rns_config):
    from reticulum_grid.client import Grid
    try:
        return Grid(home=ctx.obj["home"], connect=list(connect) or None, rns_config=rns_config)
    except (cfg.ConfigError, OSError, RuntimeError) as e:
        fail(str(e))


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


class ProgressBar:
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
            json_line({"progress": {"done_bytes": done, "total_bytes": total}})
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


def with_progress(as_json, label, run):
    """``run(progress)`` with a progress bar; a WireError ends the command."""
    try:
        with ProgressBar(as_json, label) as progress:
            return run(progress)
    except WireError as e:
        fail(f"{e.code}: {e.message}")
