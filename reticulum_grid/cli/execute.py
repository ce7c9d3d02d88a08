"""``rngrid execute``: any of the grid's user commands from a shell, its events as
JSON lines: the same table and events as ``POST /v1/grid/execute``
(gateway/commands.py), so a command added there is reachable here too."""

import json
import sys
import threading
from collections.abc import Callable

import click

from links import commands as table
from links.wire import WireError
from reticulum_grid.cli.common import client_options, fail, json_line, main, open_grid
from reticulum_grid.gateway import commands
from reticulum_grid.gateway.errors import ApiError


def listing() -> str:
    """One line per command ``rngrid execute`` runs: its path and summary."""
    summaries = {**{c.path: c.summary for c in table.of(table.USER)}, **commands.LOCAL}
    width = max(map(len, summaries))
    return "\n".join(f"  {path:<{width}}  {summaries[path]}" for path in commands.known())


class LineCall:
    """The gateway's ``bridge.Call`` seen from a shell: ``emit`` prints each
    event as a JSON line; Ctrl-C stops the work (an inference stops on the tower)."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._stoppers: list[Callable[[], None]] = []

    def emit(self, event: dict) -> None:
        json_line(event)

    def on_stop(self, fn: Callable[[], None]) -> None:
        self._stoppers.append(fn)

    def stop(self) -> None:
        self.stopped.set()
        for fn in self._stoppers:
            fn()


class ListedCommand(click.Command):
    """A click command whose ``--help`` ends with ``listing()`` as the table is
    when help is asked for (not when this module was imported)."""

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        saved, self.help = self.help, f"{self.help}\n\n\b\nCommands:\n{listing()}"
        try:
            super().format_help_text(ctx, formatter)
        finally:
            self.help = saved


@main.command(cls=ListedCommand,
              help="Run COMMAND on the grid and print its events as JSON lines, as POST /v1/grid/execute "
                   "answers them (an error: one {\"type\": \"error\"} line, exit status 1). PARAMS is a JSON "
                   "object (\"-\" reads it from stdin), e.g. '{\"model\": \"smollm2-135m\", \"prompt\": \"Hi\"}'.")
@client_options
@click.argument("command")
@click.argument("params", default="{}")
@click.option("--tower", default=None, help="The tower (name or destination hash): params.tower.")
@click.option("--busy-wait", default=60.0, show_default=True, type=click.FloatRange(0),
              help="Seconds to keep waiting while every tower is busy.")
@click.pass_context
def execute(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, command: str, params: str,
            tower: str | None, busy_wait: float) -> None:
    if command not in commands.known():
        fail(f"unknown command {command!r}; known: {', '.join(commands.known())}", 2)
    try:
        payload = json.loads(sys.stdin.read() if params == "-" else params)
    except ValueError as e:
        fail(f"PARAMS must be a JSON object: {e}", 2)
    if not isinstance(payload, dict):
        fail("PARAMS must be a JSON object", 2)
    if tower:
        payload["tower"] = tower
    grid = open_grid(ctx, connect, rns_config)
    from reticulum_grid.gateway.views import Views
    call = LineCall()
    try:
        commands.work_for(grid, Views(grid), command, payload, busy_wait)(call)
    except ApiError as e:
        fail(e.message, 2)
    except WireError as e:
        json_line({"type": "error", "code": e.code, "message": e.message, "retry_after": e.retry_after})
        sys.exit(1)
    except KeyboardInterrupt:
        call.stop()
        sys.exit(130)
    finally:
        grid.close()
