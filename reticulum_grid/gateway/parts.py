"""What the routes (openai_routes, ollama_routes, responses_routes, audio,
websocket) and http.embedded use of app.Gateway, for the type checker: none
of them imports app.py, which imports them all. app.Gateway provides every
member."""

from collections.abc import Mapping
from typing import Any, Protocol

from reticulum_grid.client import Grid
from reticulum_grid.gateway.views import Views


class GatewayParts(Protocol):
    grid: Grid
    views: Views
    #: None: no key needed.
    api_key: str | None
    #: Seconds a request waits while every tower is busy.
    busy_wait_s: float

    def check_known(self, payload: Mapping[str, Any], tower: str | None, model_code: str = ...,
                    param: str = ...) -> None: ...
