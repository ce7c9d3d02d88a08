"""Worker side: llama.cpp's own ``ggml-rpc-server`` for the memory this tower lends, supervised.

llama.cpp's RPC has no authentication and trusts every byte it reads (its
README: never on an open network), so a peer reaches the server only through
what the tower admits (split/tunnel.py, or the data plane with its HMAC
challenge), and only a tower holding ``shard`` here. Local processes are kept
out too: the server runs in a network namespace of its own
(node/private_net.py), so no other process on the machine can connect to it;
the tower gets each connection from the server's guard. Where the kernel
refuses a namespace, the server listens on the host's 127.0.0.1 and the tower
logs why (``isolation``). What such a peer can still do is bounded by the
process it talks to:

- it runs under node/childguard.py, a child of the tower that holds no key,
  no identity and no blob of the tower's, and ends with the tower;
- on a CPU tower its data segment is capped at the memory the tower lends
  (RLIMIT_DATA: lent MiB + RPC_HEADROOM_MIB), so an ALLOC_BUFFER beyond it
  fails inside the RPC server instead of taking the machine's RAM (GPU memory
  is the driver's to bound; a GPU tower lends what it announces);
- with a tensor cache (``-c``, split/tensorcache.py) its cache directory is
  the tower's own (0700, under the tower's directory); what it writes there
  from a peer is removed by the tower before the next plan uses the server,
  and it serves only files the tower seeded from its own verified blobs;
- a malformed command that makes it abort (GGML_ASSERT) ends only that child:
  the next request starts it again, after a backoff (1, 2, 4 ... 60 s) when
  it keeps dying.

ggml-rpc serves one connection at a time and never times one out, so a
connection that stays open holds the whole server. ``ready()`` proves the
server answers a HELLO (llama.cpp's first RPC command) before the tower lends
it to a plan, and starts it again when it does not (tower/shard.py holds one
plan at a time and frees a dead peer's connections).
"""

import logging
import resource
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable

from reticulum_grid.node import childguard, engine, private_net
from reticulum_grid.node.localgrid import free_port
from reticulum_grid.split.tensorcache import TensorCache

log = logging.getLogger("rngrid.split.worker")

#: Seconds a new RPC server gets to listen.
START_TIMEOUT_S = 30.0
#: Memory the RPC server needs beyond what it holds for peers (MiB: its code, threads, a graph).
RPC_HEADROOM_MIB = 512
#: Backoff after the n-th quick death in a row: min(2**n, MAX_BACKOFF_S) seconds.
MAX_BACKOFF_S = 60.0
#: A server that lived this long has its death count reset (seconds).
STABLE_S = 60.0
#: Seconds a running server gets to answer a HELLO before it counts as held or wedged.
HELLO_TIMEOUT_S = 5.0
#: ggml-rpc's HELLO (ggml/src/ggml-rpc: RPC_CMD_HELLO = 14, request = 24 bytes of
#: connection capabilities; reply = u64 size 28, then major, minor, patch, padding
#: and 24 capability bytes; sizes little-endian). Zero capabilities: plain TCP.
HELLO = bytes([14]) + struct.pack("<Q", 24) + bytes(24)
HELLO_REPLY_BYTES = 8 + 28


#: ggml-rpc's DEVICE_COUNT (RPC_CMD_DEVICE_COUNT = 15, no input; reply = u64 size 4, then a u32): the cheapest
#: command that gets an answer, so timing it times the way llama.cpp's bytes go, not the server's work.
DEVICE_COUNT = bytes([15]) + struct.pack("<Q", 0)
DEVICE_COUNT_REPLY_BYTES = 8 + 4


def hello(sock: socket.socket) -> bool:
    """Say llama.cpp's HELLO on a new connection ``sock`` and read the reply:
    True when a whole, well-formed one came. Raises OSError (a timeout set on
    ``sock`` included)."""
    return _exchange(sock, HELLO, HELLO_REPLY_BYTES)


def round_trip(sock: socket.socket) -> float | None:
    """Seconds one DEVICE_COUNT took on ``sock`` (a connection that said its
    HELLO), from the command sent to its whole reply read; None when no
    well-formed reply came. Raises OSError (a timeout set on ``sock`` included)."""
    sent = time.perf_counter()
    return time.perf_counter() - sent if _exchange(sock, DEVICE_COUNT, DEVICE_COUNT_REPLY_BYTES) else None


def _exchange(sock: socket.socket, command: bytes, reply_bytes: int) -> bool:
    """Send ``command`` and read its reply of ``reply_bytes``: True when whole, its size field right."""
    sock.sendall(command)
    got = b""
    while len(got) < reply_bytes and (part := sock.recv(reply_bytes - len(got))):
        got += part
    return len(got) == reply_bytes and struct.unpack("<Q", got[:8])[0] == reply_bytes - 8


class RpcUnavailable(RuntimeError):
    """The RPC server cannot be started now; the message says why."""


class RpcWorker:
    """The tower's RPC server child. ``ready()`` starts it (again, if it
    died) and proves it answers; ``connect()`` returns a new connection to
    it. ``private``: run it in a network of its own where the kernel allows
    (False: on the host's 127.0.0.1, for llama.cpp's own RPC client to dial
    ``endpoint()``, as bench/ and tests do without a tower between).
    ``lend_mib()`` gives the memory cap (MiB) of the next start, None for none;
    ``cache``: its tensor cache, if any. ``isolation`` says where it listens."""

    def __init__(self, log_path: str | os.PathLike[str], threads: int = 0,
                 lend_mib: Callable[[], int | None] = lambda: None, cache: TensorCache | None = None,
                 private: bool = True) -> None:
        self.log_path = log_path
        self.cache = cache
        self.threads = threads
        self.lend_mib = lend_mib
        self.private = private
        self.isolation = ""
        self.guard: subprocess.Popen[bytes] | None = None
        self.dialer: private_net.Dialer | None = None
        self.port: int | None = None
        self.deaths = 0
        self.restarts = 0
        self._started = 0.0
        self._died = 0.0
        self._lock = threading.Lock()

    def endpoint(self) -> str:
        """"127.0.0.1:port" of a server on the host's loopback, started if
        needed. Raises RpcUnavailable (not started; or it runs in a network of
        its own, which only ``connect()`` reaches)."""
        with self._lock:
            self._ensure()
            if self.dialer is not None:
                raise RpcUnavailable("the RPC server runs in a network of its own: use connect()")
            return f"127.0.0.1:{self.port}"

    def connect(self, timeout_s: float = 10.0) -> socket.socket:
        """A new connection to the running server (blocking). Raises
        RpcUnavailable when it is not running, OSError when it does not accept."""
        with self._lock:
            guard, dialer, port = self.guard, self.dialer, self.port
        if guard is None or guard.poll() is not None:
            raise RpcUnavailable("the RPC server is not running")
        if dialer is not None:
            return dialer.dial(timeout_s)
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        sock.settimeout(None)  # a tunnel's connection may rest between requests for as long as its plan lives
        return sock

    def ready(self, timeout_s: float = HELLO_TIMEOUT_S) -> None:
        """Start the server if needed and make sure it answers a HELLO within
        ``timeout_s``; one that does not (a connection holds it, or it hangs)
        is started again. Raises RpcUnavailable when it cannot start (or is in
        its backoff) or even a fresh one does not answer."""
        with self._lock:
            self._ensure()
        if self.answers_hello(timeout_s):
            return
        log.warning("the RPC server did not answer a HELLO within %.0f s: starting it again", timeout_s)
        with self._lock:
            self.stop()
            self.restarts += 1
            self._ensure()
        if not self.answers_hello(timeout_s):
            raise RpcUnavailable(f"the RPC server does not answer a HELLO; see {self.log_path}")

    def answers_hello(self, timeout_s: float = HELLO_TIMEOUT_S) -> bool:
        """True when a new connection to the running server gets llama.cpp's HELLO reply within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            with self.connect(timeout_s) as conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                return hello(conn)
        except (OSError, RpcUnavailable):
            return False

    def _ensure(self) -> None:
        if self.guard is None or self.guard.poll() is not None:
            self._restart()

    def _restart(self) -> None:
        if self.guard is not None:  # it died: count it, and wait out the backoff
            if self._died < self._started:
                self._died = time.monotonic()
                self.deaths = 1 if self._died - self._started > STABLE_S else self.deaths + 1
                log.warning("the RPC server exited (code %s); see %s", self.guard.returncode, self.log_path)
            wait = min(2.0 ** (self.deaths - 1), MAX_BACKOFF_S) - (time.monotonic() - self._died)
            if wait > 0:
                raise RpcUnavailable(f"the RPC server died {self.deaths} time(s) in a row; it restarts in {wait:.0f} s")
        self.port = port = free_port()
        argv = [engine.binary(engine.RPC_SERVER), "-H", "127.0.0.1", "-p", str(port)]
        if self.threads:
            argv += ["-t", str(self.threads)]
        env = engine.child_env()
        if self.cache is not None:
            argv.append("-c")
            env.update(self.cache.env)
        lend = self.lend_mib()
        limits = {resource.RLIMIT_DATA: (lend + RPC_HEADROOM_MIB) << 20} if lend else None
        why_not = private_net.unavailable() if self.private else "not asked for"
        self.isolation = "a network of its own" if not why_not else f"the host's 127.0.0.1 ({why_not})"
        if why_not and self.private:
            log.warning("the RPC server listens on the host's 127.0.0.1, open to every local process: %s", why_not)
        mine, theirs = socket.socketpair() if not why_not else (None, None)
        self.guard = guard = childguard.start(argv, self.log_path, env=env, limits=limits,
                                              private=(theirs, port) if theirs is not None else None)
        if theirs is not None:
            theirs.close()
        self.dialer = private_net.Dialer(mine) if mine is not None else None
        self._started = time.monotonic()
        if not self._listens(START_TIMEOUT_S):
            self.stop()
            raise RpcUnavailable(f"the RPC server did not listen within {START_TIMEOUT_S:.0f} s; see {self.log_path}")
        log.info("RPC server listening on 127.0.0.1:%d in %s (pid %s%s)", port, self.isolation,
                 childguard.program_pid(guard), f", data capped at {lend + RPC_HEADROOM_MIB} MiB" if lend else "")

    def _listens(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.guard is not None and self.guard.poll() is None:
            try:
                if self.dialer is not None:
                    self.dialer.dial(timeout_s).close()
                else:
                    socket.create_connection(("127.0.0.1", self.port or 0), timeout=0.5).close()
                return True
            except OSError:
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        guard, dialer = self.guard, self.dialer
        if guard is not None:
            childguard.stop(guard)
            self.guard = None  # stopped, not died: the next start is no restart after a crash
        if dialer is not None:
            dialer.close()
            self.dialer = None
