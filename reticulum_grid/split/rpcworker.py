"""Worker side: llama.cpp's own ``ggml-rpc-server`` for the memory this tower lends, supervised.

It listens on 127.0.0.1 only: llama.cpp's RPC has no authentication and
trusts every byte it reads (its README: never on an open network), so a peer
reaches it only through what the tower admits (split/tunnel.py, or the data
plane with its HMAC challenge), and only a tower holding ``shard`` here.
What such a peer can still do is bounded by the process it talks to:

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
"""

import logging
import resource
import os
import subprocess
import threading
import time
from collections.abc import Callable

from reticulum_grid.node import childguard, engine
from reticulum_grid.node.localgrid import free_port, wait_port
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


class RpcUnavailable(RuntimeError):
    """The RPC server cannot be started now; the message says why."""


class RpcWorker:
    """The tower's RPC server child. ``endpoint()`` starts it (again, if it
    died) and returns its "127.0.0.1:port"; ``lend_mib()`` gives the memory
    cap (MiB) of the next start, None for none; ``cache``: its tensor cache, if any."""

    def __init__(self, log_path: str | os.PathLike[str], threads: int = 0,
                 lend_mib: Callable[[], int | None] = lambda: None, cache: TensorCache | None = None) -> None:
        self.log_path = log_path
        self.cache = cache
        self.threads = threads
        self.lend_mib = lend_mib
        self.guard: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.deaths = 0
        self._started = 0.0
        self._died = 0.0
        self._lock = threading.Lock()

    def endpoint(self) -> str:
        """Raises RpcUnavailable when the server does not come up, or is in its backoff."""
        with self._lock:
            if self.guard is None or self.guard.poll() is not None:
                self._restart()
            return f"127.0.0.1:{self.port}"

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
        self.guard = guard = childguard.start(argv, self.log_path, env=env, limits=limits)
        self._started = time.monotonic()
        if not wait_port(port, START_TIMEOUT_S):
            self.stop()
            raise RpcUnavailable(f"the RPC server did not listen within {START_TIMEOUT_S:.0f} s; see {self.log_path}")
        log.info("RPC server listening on 127.0.0.1:%d (pid %s%s)", port, childguard.program_pid(guard),
                 f", data capped at {lend + RPC_HEADROOM_MIB} MiB" if lend else "")

    def stop(self) -> None:
        guard = self.guard
        if guard is not None:
            childguard.stop(guard)
