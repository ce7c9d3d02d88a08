"""Shared pieces of the ``rngrid`` command: the click group, consoles, errors, client options, progress.

Everything printed may hold strings from the network (tower names, aliases,
error messages, job fields, generated text), so nothing is ever printed as
rich markup or emoji codes, and control characters (terminal escapes,
carriage returns, bidirectional overrides) are shown as escapes: ``out`` and
``err`` render every string that way, ``styled`` builds styled text from
pieces the same way, ``visible`` is the rule itself, and log lines go
through it too (``VisibleFormatter``).
"""


import contextlib
import functools
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.text import Text

from announce.unseen import BLANK_LETTERS, hidden
from links.wire import WireError
from reticulum_grid.node import config as cfg

if TYPE_CHECKING:  # imported where used, so a command that needs neither pays nothing for them
    from rich.progress import Progress, TaskID

    from reticulum_grid.client import Grid

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
#: What logging hands a formatter for a traceback (sys.exc_info()).
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]

def visible(text: object, newlines: bool = True) -> str:
    """``text`` with every character that does not show as itself (controls: C0,
    DEL, C1; format characters: zero-width, bidirectional; blank letters; see
    announce/unseen.py) written as an escape (``\x1b``, ``\u200b``); tabs stay,
    and newlines too when ``newlines``."""
    text = str(text)
    if text.isprintable() and not BLANK_LETTERS.intersection(text):
        return text
    keep = "\t\n" if newlines else "\t"
    return "".join(c if c in keep or not hidden(text, i) else _escape(c) for i, c in enumerate(text))


def _escape(c: str) -> str:
    """Python's escape of one character: \\x1b, \\u200b, \\U000e0041."""
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"


class TextConsole(Console):
    """A rich Console that shows every string as plain text (``visible``): markup
    and emoji codes are never interpreted, whatever a caller passes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(highlight=False, markup=False, emoji=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs.update(markup=False, emoji=False)
        return super().render_str(visible(text), **kwargs)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text from ``parts``: strings, or (string, rich style) pairs; every string made ``visible``."""
    return Text.assemble(*((visible(p[0]), p[1]) if isinstance(p, tuple) else visible(p) for p in parts))


class VisibleFormatter(logging.Formatter):
    """Log lines whose message shows control characters, newlines included, as
    escapes (a name from the network cannot forge a line); tracebacks keep
    their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = visible(record.message, newlines=False)
        return super().formatMessage(record)

    def formatException(self, ei: ExcInfo) -> str:
        return visible(super().formatException(ei))


# Piped output is read by scripts and people alike: give tables room instead of cutting hashes.
out = TextConsole(width=None if sys.stdout.isatty() else 200)
err = TextConsole(stderr=True, soft_wrap=True)



_stdout_lock = threading.Lock()


def json_line(obj: object) -> None:
    """Print ``obj`` as one JSON document on one line of stdout, whole even
    when several threads print at once (a pull's sources report progress from
    their own threads). Every ``--json`` writer prints through this."""
    line = json.dumps(obj) + "\n"
    with _stdout_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(styled(("error:", "red"), " ", message))
    sys.exit(code)


@contextlib.contextmanager
def reported_errors() -> Iterator[None]:
    """A WireError inside ends the command with its code and message; Ctrl-C
    with "cancelled" and exit status 130 (what a shell reports for SIGINT)."""
    try:
        yield
    except WireError as e:
        fail(f"{e.code}: {e.message}")
    except KeyboardInterrupt:
        err.print("\ncancelled")
        sys.exit(130)


def ifac_options(f: F) -> F:
    """``--network-name`` and ``--passphrase``: a private grid's RNS interface access code."""
    f = click.option("--network-name", default=None, envvar="RNGRID_NETWORK_NAME",
                     help="Private grid: the RNS network name (IFAC) of every interface rngrid writes.")(f)
    f = click.option("--passphrase", default=None, envvar="RNGRID_PASSPHRASE",
                     help="Private grid: the RNS IFAC passphrase (or set RNGRID_PASSPHRASE: a command line is "
                          "visible to other local users).")(f)
    return f


def client_options(f: Callable[..., T]) -> Callable[..., T]:
    """``--connect``, ``--rns-config`` (passed to the command) and the IFAC
    options (kept for ``open_grid``; default: client.toml's [network])."""
    @functools.wraps(f)
    def command(*args: Any, network_name: str | None = None, passphrase: str | None = None, **kwargs: Any) -> T:
        click.get_current_context().obj["ifac"] = (network_name, passphrase)
        return f(*args, **kwargs)

    command = ifac_options(command)
    command = click.option("--connect", "connect", multiple=True, metavar="HOST:PORT",
                           help="Tower or transport node to reach over TCP (repeatable). Default: client.toml, "
                                "else 127.0.0.1:4242.")(command)
    command = click.option("--rns-config", type=click.Path(file_okay=False), default=None,
                           help="Use this existing RNS config directory (e.g. a shared rnsd).")(command)
    return command


def open_grid(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None) -> "Grid":
    from reticulum_grid.client import Grid
    network_name, passphrase = ctx.obj.get("ifac", (None, None))
    try:
        return Grid(home=ctx.obj["home"], connect=list(connect) or None, rns_config=rns_config,
                    network_name=network_name, passphrase=passphrase)
    except (cfg.ConfigError, OSError, RuntimeError) as e:
        fail(str(e))


@click.group()
@click.option("--home", type=click.Path(file_okay=False), default=None, envvar="RNGRID_HOME",
              help="Client home: identity and RNS state (default ~/.rngrid).")
@click.option("-v", "--verbose", count=True, help="-v for progress, -vv for RNS debug logs.")
@click.pass_context
def main(ctx: click.Context, home: str | None, verbose: int) -> None:
    """A GPU grid over Reticulum: run models on whichever of your machines can."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(VisibleFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    if home:
        Path(home).mkdir(parents=True, exist_ok=True)
    ctx.obj = {"home": Path(home) if home else cfg.home()}


class ProgressBar:
    """A progress callback ``(done_bytes, total_bytes)`` shown as a bar with rate
    and ETA on stderr (JSON lines on stdout with --json); silent until called."""

    def __init__(self, as_json: bool, label: str) -> None:
        self.as_json = as_json
        self.label = label
        self._bar: "Progress | None" = None
        self._task: "TaskID | None" = None

    def __enter__(self) -> "ProgressBar":
        return self

    def __call__(self, done: int, total: int) -> None:
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
            self._bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(), console=err)
            self._bar.start()
            self._task = self._bar.add_task(visible(self.label, newlines=False), total=total)
        assert self._task is not None  # added with the bar
        self._bar.update(self._task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def with_progress(as_json: bool, label: str, run: Callable[[ProgressBar], T]) -> T:
    """``run(progress)`` with a progress bar; a WireError ends the command."""
    try:
        with ProgressBar(as_json, label) as progress:
            return run(progress)
    except WireError as e:
        fail(f"{e.code}: {e.message}")
