"""Running the gateway: the bind rule and uvicorn.

The gateway binds 127.0.0.1 by default. Any other address (0.0.0.0, a
tailnet or LAN address) exposes the grid to that network, so it needs an API
key; ``check_bind`` refuses to start without one.
"""

import ipaddress
import threading
import time
from collections.abc import Iterable
from typing import Any

import uvicorn

from reticulum_grid.client import Grid
from reticulum_grid.gateway.app import Gateway
from reticulum_grid.gateway.intake import BODY_TIMEOUT_S, MAX_REQUESTS

#: Open connections at once, idle keep-alive ones and those still sending headers too (uvicorn answers 503
#: beyond). Each costs at most uvicorn's 64 KiB read buffer before reading pauses.
MAX_CONNECTIONS = 1024


class BindRefused(ValueError):
    pass


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_bind(host: str, api_key: str | None) -> None:
    """Raise BindRefused when ``host`` is not a loopback address and there is no API key."""
    if not is_loopback(host) and not api_key:
        raise BindRefused(f"binding {host} exposes the grid beyond this machine: give an API key "
                          "(--api-key KEY or RNGRID_API_KEY)")


def server(grid: Grid, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
           busy_wait_s: float | None = None, origins: Iterable[str] = (), log_level: str = "warning",
           max_requests: int = MAX_REQUESTS, body_timeout_s: float = BODY_TIMEOUT_S) -> uvicorn.Server:
    """A uvicorn.Server for the gateway on ``host:port`` (not started); ``origins``:
    web origins allowed to call it (CORS); ``max_requests``, ``body_timeout_s``:
    intake.py's limits. Raises BindRefused."""
    check_bind(host, api_key)
    options = {} if busy_wait_s is None else {"busy_wait_s": busy_wait_s}
    app = Gateway(grid, api_key=api_key, origins=origins, loopback=is_loopback(host), max_requests=max_requests,
                  body_timeout_s=body_timeout_s, **options).app()
    # lifespan off: the app holds nothing that starts or stops with the server. limit_concurrency caps
    # open connections, also those that never finish their headers (the app never sees them); the app
    # answers its own, clearer 503 below that (intake.py).
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="off",
                            timeout_graceful_shutdown=2, limit_concurrency=max(MAX_CONNECTIONS, max_requests))
    return uvicorn.Server(config)


class BackgroundServer:
    """The gateway served from a thread of this process (tests, benchmarks):
    ``with BackgroundServer(grid, port=...) as url: ...``."""

    def __init__(self, grid: Grid, host: str = "127.0.0.1", port: int = 8080, **options: Any) -> None:
        self.server = server(grid, host, port, **options)
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self.server.run, name="rngrid-gateway", daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 15.0
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.close()
                raise RuntimeError(f"the gateway did not start on {self.url}")
            time.sleep(0.02)
        return self.url

    def close(self) -> None:
        self.server.should_exit = True
        self._thread.join(10.0)

    def __exit__(self, *exc: object) -> None:
        self.close()
