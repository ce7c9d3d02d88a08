"""``rngrid serve``: the grid behind OpenAI's and Ollama's HTTP APIs and a live dashboard."""

import click

from reticulum_grid.cli.common import client_options, err, fail, main, open_grid
from reticulum_grid.node import config as cfg

#: intake.py's defaults, repeated here so `rngrid --help` works without the gateway's extra
#: (tests/gateway/test_gateway_flood.py checks they agree).
MAX_REQUESTS, BODY_TIMEOUT_S = 256, 30.0


@main.command()
@client_options
@click.option("--listen", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT",
              help="Address to serve HTTP on; anything but loopback needs --api-key.")
@click.option("--api-key", default=None, envvar="RNGRID_API_KEY",
              help="Key every request must send as 'Authorization: Bearer KEY' (or set RNGRID_API_KEY).")
@click.option("--busy-wait", default=30.0, show_default=True, type=click.FloatRange(0),
              help="Seconds a request waits for a free slot or queue place while every tower is busy before "
                   "answering 429 (it asks a last time at the end).")
@click.option("--max-requests", default=MAX_REQUESTS, show_default=True, type=click.IntRange(1),
              help="HTTP requests and WebSockets served at once; more are answered 503.")
@click.option("--body-timeout", default=BODY_TIMEOUT_S, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Seconds a request's body may take to arrive before it is answered 408.")
@click.option("--cors-origin", "origins", multiple=True, metavar="ORIGIN",
              help="A web app origin allowed to call the API from a browser, e.g. http://localhost:5173 (repeatable).")
@click.pass_context
def serve(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, listen: str, api_key: str | None,
          busy_wait: float, max_requests: int, body_timeout: float, origins: tuple[str, ...]) -> None:
    """Serve the grid to OpenAI clients (/v1), Ollama clients (/api), any language (/v1/grid/execute) and a
    browser (/)."""
    try:
        from reticulum_grid.gateway.server import BindRefused, check_bind, server
    except ImportError as e:
        fail(f"the gateway needs its extra: pip install 'reticulum-grid[gateway]' ({e})")
    try:
        host, port = cfg.parse_hostport(listen)
        check_bind(host, api_key)
    except (cfg.ConfigError, BindRefused) as e:
        fail(str(e))
    grid = open_grid(ctx, connect, rns_config)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    err.print(f"grid gateway on {url} (dashboard), OpenAI base_url {url}/v1, OLLAMA_HOST={url}, "
              f"identity {grid.identity_hash}" + ("; API key required" if api_key else ""))
    try:
        server(grid, host, port, api_key=api_key, busy_wait_s=busy_wait, origins=origins, max_requests=max_requests,
               body_timeout_s=body_timeout).run()
    except OSError as e:
        fail(f"cannot serve on {listen}: {e}")
    finally:
        grid.close()
