"""One llama.cpp ``llama-server`` per loaded model: a supervised child on 127.0.0.1.

As Ollama and LocalAI run it: the tower starts the server on an ephemeral loopback port
with a random per-start API key that only the tower knows (in the child's environment,
never its command line: no other local user can use it), waits until ``/health`` says
the model is loaded, and keeps its log beside the tower's (``last_error`` is the line a
user is shown). A runner that dies is restarted with backoff (1, 2, 4 ... 60 s) until it
is closed. The child runs under node/childguard.py, so it ends with the tower even after
``kill -9`` of the tower.

The server gives parallel slots with continuous batching over one copy of the
weights and a unified KV cache (``parallel`` sequences of ``n_ctx`` tokens
each), prompt caching per slot, per-request LoRA scales, speculative decoding
with a draft model, embeddings, and RPC devices (split models). Its HTTP API
is used as documented in llama.cpp's tools/server/README.md.
"""

import http.client
import json
import logging
import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from reticulum_grid.inference.placement import LoadError, Placement, parse_placement
from reticulum_grid.inference.runner_spec import RunnerSpec
from reticulum_grid.node import childguard, engine
from reticulum_grid.node.localgrid import free_port

log = logging.getLogger("rngrid.runner")

KEY_ENV = "LLAMA_API_KEY"  #: llama-server's API key variable (common/arg.cpp); /proc/PID/environ: its user only
#: Seconds a runner may take to load its model before it counts as failed.
LOAD_TIMEOUT_S = 600.0
#: Restart backoff after the n-th death in a row: min(2**n, MAX_BACKOFF_S) seconds.
MAX_BACKOFF_S = 60.0
#: A runner that stayed up this long has its death count reset (seconds).
STABLE_S = 60.0
#: Seconds an HTTP call to the runner may take (a stream: between two events).
CALL_TIMEOUT_S = 120.0
#: Log lines (at most TAIL_BYTES) read back for error messages.
TAIL_LINES = 40
TAIL_BYTES = 16384
#: A runner's log is moved aside (to .1) when a start finds it larger (bytes).
LOG_ROTATE_BYTES = 16 << 20


class RunnerError(Exception):
    """The runner answered an error (``status``: HTTP status, 0 when it could
    not be reached) with ``message`` (llama-server's own). ``kind``: llama-
    server's error type, or for status 0 "timeout" (it stopped answering) or
    "closed" (its connection ended: it died)."""

    def __init__(self, status: int, message: str, kind: str = "") -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.kind = status, message, kind


@dataclass
class _Life:
    """One start of the child: its guard process, port and key, where its log began."""
    guard: subprocess.Popen[bytes]
    port: int
    key: str
    log_offset: int
    started: float = field(default_factory=time.monotonic)


class Runner:
    """A supervised llama-server. ``start()`` loads the model (raises LoadError);
    ``call``/``stream`` talk to it; ``close()`` ends it for good."""

    def __init__(self, spec: RunnerSpec, log_path: Path, name: str = "runner",
                 on_restart: Callable[[], None] | None = None, restart: bool = True,
                 stream_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.spec = spec
        self.log_path = log_path
        self.name = name
        self.on_restart = on_restart
        self.restart = restart
        self.stream_timeout_s = stream_timeout_s
        self.placement: Placement | None = None
        self.props: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self._life: _Life | None = None
        self._deaths = 0
        self._closed = False
        self._lock = threading.RLock()
        self._up = threading.Event()

    # -- life cycle -------------------------------------------------------
    def start(self, timeout_s: float = LOAD_TIMEOUT_S, progress: Callable[[], int] | None = None,
              quiet_s: float | None = None) -> Self:
        """Start the child and wait until its model is loaded. Raises LoadError
        (``out_of_memory`` when llama.cpp's log says an allocation failed,
        ``stuck`` when ``progress()`` (a count, e.g. bytes the model's
        tunnels moved) stood still for ``quiet_s`` seconds)."""
        with self._lock:
            self._spawn()
            self._wait_ready(timeout_s, progress, quiet_s)
        if self.restart:
            threading.Thread(target=self._supervise, args=(self._life,), name=f"rngrid-runner-{self.name}",
                             daemon=True).start()
        return self

    def _spawn(self) -> _Life:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.exists() and self.log_path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(self.log_path, self.log_path.with_name(self.log_path.name + ".1"))
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        port, key = free_port(), secrets.token_urlsafe(24)
        guard = childguard.start(self.spec.argv(port), self.log_path, env={**engine.child_env(), KEY_ENV: key})
        self._life = _Life(guard, port, key, offset)
        self._up.clear()
        return self._life

    def _wait_ready(self, timeout_s: float, progress: Callable[[], int] | None = None,
                    quiet_s: float | None = None) -> None:
        life, deadline = self._life, time.monotonic() + timeout_s
        assert life is not None  # just spawned, under the lock
        seen, still_until = None, time.monotonic() + (quiet_s or timeout_s)
        while True:
            if life.guard.poll() is not None:
                raise LoadError(f"llama-server exited while loading ({self.last_error() or 'no message'})",
                                self.log_text())
            try:
                if self._request("GET", "/health", None, timeout=5.0, life=life)[0] == 200:
                    break
            except OSError:
                pass
            now = time.monotonic()
            if progress is not None and (count := progress()) != seen:
                seen, still_until = count, now + (quiet_s or timeout_s)
            if now > deadline or now > still_until:
                childguard.stop(life.guard)
                error = LoadError(f"llama-server did not load the model within {timeout_s:.0f} s" if now > deadline
                                  else f"loading moved nothing for {quiet_s or timeout_s:.0f} s", self.log_text())
                error.stuck = now <= deadline
                raise error
            time.sleep(0.1)
        self.placement = parse_placement(self.log_text())
        self.props = self.call("GET", "/props")
        self.meta = next(iter(self.call("GET", "/v1/models").get("data") or [{}])).get("meta") or {}
        self._up.set()
        log.info("runner %s up on 127.0.0.1:%d (pid %s, %d slot(s) of %d tokens)", self.name, life.port,
                 childguard.program_pid(life.guard), self.spec.parallel, self.spec.n_ctx)

    def _supervise(self, life: _Life) -> None:
        code: int | None = life.guard.wait()
        while True:
            with self._lock:
                if self._closed or self._life is not life:
                    return
                self._up.clear()
                self._deaths = 1 if time.monotonic() - life.started > STABLE_S else self._deaths + 1
                wait = min(2.0 ** (self._deaths - 1), MAX_BACKOFF_S)
            log.warning("runner %s exited (code %s): %s; restarting in %.0f s", self.name, code,
                        self.last_error() or "no message", wait)
            time.sleep(wait)
            with self._lock:
                if self._closed:
                    return
                try:
                    life = self._spawn()
                    self._wait_ready(LOAD_TIMEOUT_S)
                except LoadError as e:
                    log.error("runner %s did not come back: %s", self.name, e)
                    code = life.guard.poll()
                    continue
            if self.on_restart:
                self.on_restart()
            code = life.guard.wait()

    @property
    def n_vocab(self) -> int:
        """The model's vocabulary size (tokens)."""
        return int(self.meta.get("n_vocab") or 1 << 31)

    @property
    def supports_tools(self) -> bool:
        """Whether the model's chat template describes tools (llama-server parses its tool calls)."""
        return bool((self.props.get("chat_template_caps") or {}).get("supports_tools"))

    @property
    def exited(self) -> bool:
        """True once the current child process ended (a crash, or close())."""
        life = self._life
        return life is None or life.guard.poll() is not None

    @property
    def alive(self) -> bool:
        life = self._life
        return self._up.is_set() and life is not None and life.guard.poll() is None

    def wait_up(self, timeout_s: float) -> bool:
        """True once the runner serves (after a restart), within ``timeout_s`` seconds."""
        return self._up.wait(timeout_s) and not self._closed

    @property
    def pid(self) -> int | None:
        """The llama-server process id (None while none runs)."""
        life = self._life
        return childguard.program_pid(life.guard) if life else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._up.clear()
            life, self._life = self._life, None
        if life is not None:
            childguard.stop(life.guard)

    # -- log --------------------------------------------------------------
    def log_text(self, tail_bytes: int | None = None) -> str:
        """What the current child wrote to its log so far (its last ``tail_bytes``)."""
        life = self._life
        try:
            with open(self.log_path, "rb") as f:
                start = life.log_offset if life else 0
                if tail_bytes is not None:
                    start = max(start, f.seek(0, os.SEEK_END) - tail_bytes)
                f.seek(start)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def last_error(self) -> str:
        """The last line of the child's log that reads like an error ("" if none)."""
        lines = self.log_text(tail_bytes=TAIL_BYTES).splitlines()[-TAIL_LINES:]
        for line in reversed(lines):
            low = line.lower()
            if "error" in low or "failed" in low or "abort" in low or "out of memory" in low:
                return line.strip()[:300]
        return ""

    # -- HTTP -------------------------------------------------------------
    def _request(self, method: str, path: str, body: object, timeout: float,
                 life: _Life | None = None) -> tuple[int, bytes]:
        life = life or self._life
        if life is None:
            raise ConnectionRefusedError("runner is closed")
        conn = http.client.HTTPConnection("127.0.0.1", life.port, timeout=timeout)
        try:
            headers = {"Authorization": f"Bearer {life.key}"}
            data = None if body is None else json.dumps(body).encode()
            if data is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, data, headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def call(self, method: str, path: str, body: object = None, timeout: float = CALL_TIMEOUT_S) -> Any:
        """One JSON request; the decoded reply. Raises RunnerError."""
        try:
            status, data = self._request(method, path, body, timeout)
        except OSError as e:
            raise RunnerError(0, f"the runner is not reachable: {e}") from None
        reply = _json(data)
        if status != 200:
            raise _error(status, reply, data)
        return reply

    def stream(self, path: str, body: dict[str, Any], timeout: float | None = None) -> "RunnerStream":
        """A streamed request (SSE): an iterable of decoded events. Raises RunnerError."""
        life = self._life
        if life is None:
            raise RunnerError(0, "the runner is closed")
        return RunnerStream(life.port, life.key, path, body, timeout or self.stream_timeout_s)


class RunnerStream:
    """One streamed completion from a runner: iterate for its event maps;
    ``close()`` from any thread ends it (the runner then frees the slot)."""

    def __init__(self, port: int, key: str, path: str, body: dict[str, Any], timeout: float) -> None:
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self._closed = False
        try:
            self._conn.request("POST", path, json.dumps({**body, "stream": True}).encode(),
                               {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
            self._resp = self._conn.getresponse()
        except OSError as e:
            self._conn.close()
            raise RunnerError(0, f"the runner is not reachable: {e}") from None
        if self._resp.status != 200:
            data = self._resp.read()
            self._conn.close()
            raise _error(self._resp.status, _json(data), data)

    def __iter__(self) -> Iterator[Any]:
        """The stream's events, up to the one that ends it (``stop`` true, or
        OpenAI's ``[DONE]``). Raises RunnerError when it breaks off before,
        unless ``close()`` ended it."""
        try:
            for raw in self._resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators and ": ping" comments
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                event = _json(payload)
                if isinstance(event, dict) and "error" in event:
                    raise _error(500, event, payload)
                yield event
                if isinstance(event, dict) and event.get("stop") is True:
                    return
            if not self._closed:
                raise RunnerError(0, "the runner's stream ended before its last event", "closed")
        except RunnerError:
            raise
        except TimeoutError:
            if not self._closed:
                raise RunnerError(0, "the runner stopped answering", "timeout") from None
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
            # (close() from another thread leaves http.client reading a shut socket: any of these)
            if not self._closed:
                raise RunnerError(0, f"the runner's stream broke: {type(e).__name__}: {e}", "closed") from None
        finally:
            self.close()

    def settimeout(self, seconds: float) -> None:
        """The longest wait for the next event from now on (seconds)."""
        if self._conn.sock is not None:
            self._conn.sock.settimeout(seconds)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._conn.close()


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, TypeError):
        return None


def _error(status: int, reply: object, data: bytes | None) -> RunnerError:
    err = reply.get("error") if isinstance(reply, dict) else None
    if isinstance(err, dict):
        return RunnerError(int(err.get("code") or status), str(err.get("message", "")), str(err.get("type", "")))
    return RunnerError(status, (data or b"").decode("utf-8", "replace")[:300])
