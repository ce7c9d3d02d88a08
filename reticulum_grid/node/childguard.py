"""Run a program as a child that ends with the tower, even after ``kill -9`` of the tower.

    python -m reticulum_grid.node.childguard -- PROGRAM ARGS...

The guard is a small process between the tower and a program that never reads
its stdin (llama-server, ggml-rpc-server). It starts the program and waits;
when its own stdin closes (the tower exited, however it went) or it gets
SIGTERM, it sends the program SIGTERM, then SIGKILL after ``GRACE_S``, and
exits. It exits with the program's exit code (128 + signal when a signal
ended it), so the tower sees a crash as the guard ending. On Linux the program
also gets PR_SET_PDEATHSIG, so it dies with the guard itself (the signal
follows the thread that started it: the guard's main thread, which lives as
long as the guard).

With ``--private-net=FD:PORT`` the guard first moves into a network namespace
of its own (node/private_net.py), so the program's 127.0.0.1 is one no other
process shares, and answers the tower's dials on the inherited socket ``FD``
with connections to the program's ``PORT`` there. When the kernel refuses the
namespace, the guard says why and exits with PRIVATE_NET_REFUSED before
starting the program.

``start(argv, log_path)`` is the tower's side.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

from reticulum_grid.node import private_net

#: Seconds a program gets to exit after SIGTERM before SIGKILL.
GRACE_S = 5.0
#: The guard's exit code when ``--private-net`` was asked and the kernel refused it.
PRIVATE_NET_REFUSED = 97
_PR_SET_PDEATHSIG = 1


def start(argv: Sequence[str], log_path: str | os.PathLike[str], env: Mapping[str, str] | None = None,
          limits: Mapping[int, int] | None = None,
          private: tuple[socket.socket, int] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` under a guard; its output goes to ``log_path`` (appended).
    ``limits``: {resource.RLIMIT_*: bytes} set on the program (e.g. RLIMIT_DATA).
    ``private``: (the guard's end of a Unix socket pair, the program's TCP
    port) to run the program in a network of its own (node/private_net.py);
    the caller keeps the other end and closes this one once the guard runs.
    Returns the guard's Popen (close its stdin, or ``stop()``, to end both)."""
    spec = [f"--limit={k}:{v}" for k, v in (limits or {}).items()]
    fds: tuple[int, ...] = ()
    if private is not None:
        pair, port = private
        spec.append(f"--private-net={pair.fileno()}:{port}")
        fds = (pair.fileno(),)
    with open(log_path, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "reticulum_grid.node.childguard", *spec, "--", *argv],
                                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env, pass_fds=fds)


def stop(guard: subprocess.Popen[bytes], timeout_s: float = GRACE_S + 5.0) -> None:
    """End a guard and its program (stdin closed, then SIGKILL if it lingers)."""
    if guard.poll() is not None:
        return
    try:
        if guard.stdin is not None:
            guard.stdin.close()
    except OSError:
        pass
    try:
        guard.wait(timeout_s)
    except subprocess.TimeoutExpired:
        guard.kill()
        guard.wait(5)


def program_pid(guard: subprocess.Popen[bytes]) -> int | None:
    """The pid of the program a guard runs, or None (not started yet, or gone)."""
    import psutil
    try:
        children = psutil.Process(guard.pid).children()
    except psutil.Error:
        return None
    return children[0].pid if children else None


def _preexec(limits: Mapping[int, int]) -> Callable[[], None]:
    def run() -> None:
        os.setpgid(0, 0)  # a Ctrl-C meant for the tower's terminal reaches the program through us only
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if limits:
            import resource
            for which, value in limits.items():
                resource.setrlimit(which, (value, value))
    return run


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    limits: dict[int, int] = {}
    private: tuple[int, int] | None = None
    while args and args[0].startswith(("--limit=", "--private-net=")):
        option, value = args.pop(0).split("=", 1)
        first, second = (int(v) for v in value.split(":"))
        if option == "--limit":
            limits[first] = second
        else:
            private = (first, second)
    if not args or args[0] != "--" or len(args) < 2:
        print("usage: python -m reticulum_grid.node.childguard [--limit=R:V ...] [--private-net=FD:PORT] "
              "-- PROGRAM ARGS...", file=sys.stderr)
        return 2
    if private is not None:
        try:  # before any thread starts: the kernel gives a user namespace to a single-threaded process only
            private_net.enter()
        except OSError as e:
            print(f"childguard: no private network for {args[1]}: {e}", file=sys.stderr)
            return PRIVATE_NET_REFUSED
    proc = subprocess.Popen(args[1:], stdin=subprocess.DEVNULL, preexec_fn=_preexec(limits))
    if private is not None:
        pair = socket.socket(fileno=private[0])
        threading.Thread(target=private_net.serve_dials, args=(pair, private[1]), daemon=True).start()
    done = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tower decides when we end

    def watch_stdin() -> None:
        try:  # os.read: a buffered read would hold a lock the interpreter's exit waits on
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not done.is_set() and proc.poll() is None:
        done.wait(0.2)
    _end(proc)
    code = proc.returncode
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())  # no interpreter shutdown: the stdin thread may still be in a read
