"""Worker side: llama.cpp's RPC server for this tower's memory, in a child
process the tower supervises, listening on 127.0.0.1 only.

Run as ``python -m reticulum_grid.split.rpcworker --port P --cache DIR
[--threads N]``. The child ends when its stdin closes (the tower went away),
so a killed tower never leaves an RPC server behind. ``DIR`` is llama.cpp's
RPC tensor cache: a coordinator that loads the same model again sends only
tensor hashes, not the weights.
"""

import argparse
import logging
import os
import subprocess
import sys
import threading

from reticulum_grid.node.localgrid import free_port, wait_port

log = logging.getLogger("rngrid.split.worker")

#: Seconds a new RPC server gets to listen.
START_TIMEOUT_S = 30.0


class RpcWorker:
    """The tower's RPC server child. ``endpoint()`` starts it (again, if it
    died) and returns its "127.0.0.1:port"."""

    def __init__(self, cache_dir, log_path, threads=0):
        self.cache_dir = cache_dir
        self.log_path = log_path
        self.threads = threads
        self.proc = None
        self.port = None
        self._lock = threading.Lock()

    def endpoint(self):
        """Raises RuntimeError when the server does not come up."""
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            return f"127.0.0.1:{self.port}"

    def _start(self):
        self.port = free_port()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "reticulum_grid.split.rpcworker", "--port", str(self.port),
                 "--cache", str(self.cache_dir), "--threads", str(self.threads)],
                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
        if not wait_port(self.port, START_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"the RPC server did not listen within {START_TIMEOUT_S:.0f} s; see {self.log_path}")
        log.info("RPC server listening on 127.0.0.1:%d (pid %d)", self.port, self.proc.pid)

    def stop(self):
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="rpcworker")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cache", default="")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    from reticulum_grid.split import ggml
    threads = args.threads or os.cpu_count() or 1
    # Bound to 127.0.0.1 only: RPC has no authentication (see tunnel.py).
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    ggml.start_rpc_server(f"127.0.0.1:{args.port}", args.cache or None, threads, ggml.local_devices())
    os._exit(1)  # start_rpc_server returns only when it could not serve


def _exit_with_parent():
    sys.stdin.buffer.read()  # returns when the tower closes our stdin or dies
    os._exit(0)


if __name__ == "__main__":
    main()
