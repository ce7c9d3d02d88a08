"""``/v1/grid/ws``: the grid's commands over one WebSocket, several at once.

Every message is one JSON object in a text frame (at most MAX_MESSAGE_BYTES).

From the client:

- ``{"id": ID, "command": str, "params": {...}}`` runs a command: the
  commands and params of ``POST /v1/grid/execute`` (commands.py). ``ID`` is a
  string or an integer of the client's choosing, unique among its running
  commands; at most MAX_RUNNING run at once on one socket.
- ``{"id": ID, "type": "cancel"}`` stops that command: an inference stream is
  cancelled on its tower at once; a training job keeps running (only the
  watching stops), as when an HTTP client leaves.
- ``{"type": "auth", "api_key": KEY}``: the first message, when the gateway
  has an API key and the handshake carried no ``Authorization: Bearer KEY``
  (a browser's WebSocket cannot set that header).

From the gateway: each command's events, the same as ``/v1/grid/execute``
sends, each with the command's ``"id"``; then ``{"id", "type": "done",
"cancelled": bool}``. A failure, also a command refused at once (unknown
command or model, bad params, too many running), is one ``{"id", "type":
"error", "code", "message", "retry_after"}`` event (the grid's codes,
errors.py), then done. A message without a usable id, a cancel of nothing, or
an id that is running already gets the error event alone (id null when none
was named). Either way the socket and the other commands go on.

Checks before any command runs: the browser guard's Host and Origin rules
(guard.py) refuse the handshake (HTTP 403); a wrong key in the handshake is
refused the same way; a socket that must authenticate and sends anything
else first, or a wrong key, gets an error event and is closed (code 1008).
"""

import asyncio
import hmac
import json
import logging

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from links.wire import Code
from reticulum_grid.gateway import commands
from reticulum_grid.gateway.bridge import Call, Stopped
from reticulum_grid.gateway.errors import ApiError, as_api_error, bad_request
from reticulum_grid.gateway.http import check_key, parse_json
from reticulum_grid.gateway.inference import Event
from reticulum_grid.gateway.intake import MAX_BODY_BYTES
from reticulum_grid.gateway.parts import GatewayParts

log = logging.getLogger("rngrid.gateway")

PATH = "/v1/grid/ws"
#: Largest message read (bytes), as the HTTP body limit.
MAX_MESSAGE_BYTES = MAX_BODY_BYTES
#: Commands one socket may run at once; more are answered "busy".
MAX_RUNNING = 32
#: Seconds a socket that must authenticate has for its auth message.
AUTH_TIMEOUT_S = 10.0
#: Close code of a socket refused after the handshake (RFC 6455: policy violation).
POLICY_VIOLATION = 1008
#: A command's id: a string or an integer of the client's choosing (None: no usable id was named).
CommandId = str | int | None


class Refused(Exception):
    """A message refused: ``error`` (an ApiError) answers command ``command_id``;
    ``ends``: that command is over (its done event follows the error)."""

    def __init__(self, command_id: CommandId, error: ApiError, ends: bool = False) -> None:
        super().__init__(error.message)
        self.command_id, self.error, self.ends = command_id, error, ends


def route(gateway: GatewayParts) -> WebSocketRoute:
    """The WebSocketRoute for ``gateway`` (app.Gateway)."""

    async def endpoint(websocket: WebSocket) -> None:
        await CommandSocket(gateway, websocket).serve()

    return WebSocketRoute(PATH, endpoint)


def error_event(command_id: CommandId, error: BaseException) -> Event:
    """The error event of ``error`` (any exception) for command ``command_id``."""
    api = as_api_error(error)
    return {"id": command_id, "type": "error", "code": api.code, "message": api.message,
            "retry_after": api.retry_after}


class CommandSocket:
    """One client's socket: reads its messages, runs each command as a
    bridge.Call and sends their events, in order per command."""

    def __init__(self, gateway: GatewayParts, websocket: WebSocket) -> None:
        self.gateway = gateway
        self.websocket = websocket
        self.calls: dict[str | int, Call[Event]] = {}  # command id -> Call, while it runs
        self.cancelled: set[str | int] = set()  # ids of running commands the client cancelled
        self.tasks: set[asyncio.Task[None]] = set()
        self.gone = asyncio.Event()
        self._sending = asyncio.Lock()

    async def serve(self) -> None:
        api_key = self.gateway.api_key
        authed = self._authorization() is None  # (always without a key)
        if api_key is not None and self.websocket.headers.get("authorization") and not authed:
            return await self.websocket.close(code=POLICY_VIOLATION)  # before accept: the handshake gets 403
        await self.websocket.accept()
        try:
            if api_key is not None and not authed and not await self._authenticate(api_key):
                return await self.websocket.close(code=POLICY_VIOLATION)
            await self._read()
        finally:
            self.gone.set()
            for call in list(self.calls.values()):
                call.stop()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)

    def _authorization(self) -> ApiError | None:
        """The ApiError(401) of the handshake's key, None when it passes."""
        try:
            check_key(self.gateway.api_key, self.websocket.headers)
        except ApiError as e:
            return e
        return None

    async def _authenticate(self, api_key: str) -> bool:
        """True when the first message gives ``api_key``."""
        message: object
        try:
            text = await asyncio.wait_for(self._receive(), AUTH_TIMEOUT_S)
            message = parse_json(text or "null")
        except (asyncio.TimeoutError, ValueError, WebSocketDisconnect):
            message = None
        key = message.get("api_key") if isinstance(message, dict) and message.get("type") == "auth" else None
        if isinstance(key, str) and hmac.compare_digest(key.encode(), api_key.encode()):
            return True
        error = ApiError(401, "missing or wrong API key: send {\"type\": \"auth\", \"api_key\": KEY} first "
                              "(or Authorization: Bearer KEY in the handshake)", code="invalid_api_key")
        await self._send(error_event(None, error))
        return False

    async def _receive(self) -> str | None:
        """The next text message (bytes decoded as UTF-8); None for an empty one.
        Raises WebSocketDisconnect."""
        message = await self.websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        if message.get("text") is not None:
            return message["text"]
        return (message.get("bytes") or b"").decode("utf-8", errors="replace")

    async def _read(self) -> None:
        while True:
            try:
                text = await self._receive()
            except WebSocketDisconnect:
                return
            try:
                self._handle(text)
            except Refused as e:
                await self._send(error_event(e.command_id, e.error))
                if e.ends:
                    await self._send({"id": e.command_id, "type": "done", "cancelled": False})

    def _handle(self, text: str | None) -> None:
        """Start or cancel what ``text`` asks. Raises Refused."""
        if text is None or len(text.encode()) > MAX_MESSAGE_BYTES:
            raise _for(None, bad_request(f"a message must be a JSON object of at most {MAX_MESSAGE_BYTES} bytes",
                                         "message"))
        try:
            message = parse_json(text)
        except ValueError as e:
            raise _for(None, bad_request(f"the message is not JSON the grid takes: {e}", "message")) from None
        if not isinstance(message, dict):
            raise _for(None, bad_request("a message must be a JSON object", "message"))
        command_id = message.get("id")
        if not isinstance(command_id, (str, int)) or isinstance(command_id, bool):
            raise _for(None, bad_request("'id' must be a string or an integer", "id"))
        if message.get("type") == "cancel":
            return self._cancel(command_id)
        command = message.get("command")
        if not isinstance(command, str):
            raise _for(command_id, bad_request("a message needs 'command' (or \"type\": \"cancel\")", "command"),
                       ends=True)
        if command_id in self.calls:  # no done: that id's done belongs to the running command
            raise _for(command_id, bad_request(f"command id {command_id!r} is running already", "id"))
        if len(self.calls) >= MAX_RUNNING:
            raise _for(command_id, ApiError(429, f"{MAX_RUNNING} commands run on this socket already",
                                            code=Code.BUSY), ends=True)
        try:
            call = self._start(command, message.get("params", {}))
        except Exception as e:
            raise _for(command_id, as_api_error(e), ends=True) from None
        self.calls[command_id] = call
        task = asyncio.ensure_future(self._pump(command_id, call))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _start(self, command: str, params: object) -> Call[Event]:
        gateway = self.gateway
        work = commands.work_for(gateway.grid, gateway.views, command, params, gateway.busy_wait_s)
        if command in ("ai/inference", "ai/embeddings") and isinstance(params, dict):  # work_for checked it is
            gateway.check_known(params, params.get("tower"), model_code=Code.UNKNOWN_MODEL, param="params.model")
        return Call(work, name=f"rngrid-gateway-ws-{command}")

    def _cancel(self, command_id: str | int) -> None:
        call = self.calls.get(command_id)
        if call is None:
            raise _for(command_id, bad_request(f"no command {command_id!r} runs on this socket", "id"))
        self.cancelled.add(command_id)
        call.stop()

    async def _pump(self, command_id: str | int, call: Call[Event]) -> None:
        try:
            async for event in call.events(self.gone):
                await self._send({"id": command_id, **event})
        except Stopped:
            return
        except Exception as e:
            if command_id not in self.cancelled:  # a cancelled stream's own error is what was asked for
                await self._send(error_event(command_id, e))
        finally:
            self.calls.pop(command_id, None)
        cancelled = command_id in self.cancelled
        self.cancelled.discard(command_id)
        await self._send({"id": command_id, "type": "done", "cancelled": cancelled})

    async def _send(self, event: Event) -> None:
        if self.gone.is_set():
            return
        try:
            async with self._sending:
                await self.websocket.send_text(json.dumps(event))
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.gone.set()  # the socket closed under us: the reader ends and stops the rest


def _for(command_id: CommandId, error: ApiError, ends: bool = False) -> Refused:
    """``error`` refusing a message about command ``command_id``; ``ends``:
    that command is over (its done event follows the error)."""
    return Refused(command_id, error, ends)
