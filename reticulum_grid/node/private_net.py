"""A network of a child's own: a loopback no other process can reach, and the one way in.

llama.cpp's ``ggml-rpc-server`` listens on TCP only, with no authentication
(its README: never on an open network). On 127.0.0.1 every local user and
process can still connect to it, and a memory-safety bug in its RPC would then
run code as the tower's user. On Linux the tower's guard process therefore
moves itself, before it starts the server, into a network namespace of its own
(``unshare(CLONE_NEWNET)``, inside a new user namespace when the tower is not
root, as rootless containers do), whose loopback only the processes in it
share. Nothing outside that namespace can open a TCP connection to the server.

The tower gets in through a Unix socket pair it made before starting the
guard (an anonymous socket: it has no path, so no other process can connect
to it): for each dial the tower writes one byte, and the guard connects to the
server on the namespace's loopback and sends the connected socket back over
the pair (SCM_RIGHTS). The tower then talks to the server on that socket
directly; no byte goes through a relay.

What holds: no process of another user can reach the server; neither can a
process of the tower's own user without entering the namespace
(``nsenter``/``setns``, which needs the rights over the tower's user namespace
that such a process already has over the tower itself: ptrace, its identity
file). Where the kernel refuses a namespace (not Linux; user namespaces
switched off, as AppArmor's ``apparmor_restrict_unprivileged_userns`` does on
Ubuntu 24.04 for unconfined programs), ``unavailable()`` says why, the server
listens on the host's 127.0.0.1 as before, and the tower logs a warning.

    python -m reticulum_grid.node.private_net   # exits 0 where a private network can be made here
"""

import ctypes
import fcntl
import functools
import os
import socket
import struct
import subprocess
import sys
import threading

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
# linux/sockios.h and linux/if.h: get and set an interface's flags; IFF_UP.
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH14x"  # struct ifreq: the name, then ifr_flags in the union
#: What the guard answers a dial with: one byte, then the socket as ancillary data when it is OK.
DIAL_OK, DIAL_FAILED = b"\x01", b"\x00"
#: Seconds the probe of ``unavailable()`` may take.
PROBE_TIMEOUT_S = 10.0


def enter() -> None:
    """Move this process (single-threaded: the kernel refuses a user namespace
    to a threaded one) into a new network namespace with its loopback up.
    Raises OSError saying which step the kernel refused."""
    if not sys.platform.startswith("linux"):
        raise OSError(f"no network namespaces on {sys.platform}")
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNET | (0 if uid == 0 else _CLONE_NEWUSER)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare: {os.strerror(errno)}")
    if uid != 0:  # the same ids inside: files keep their owners, so the server reads what the tower gave it
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        now = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", now | _IFF_UP))


@functools.cache
def unavailable() -> str:
    """"" where a guard can make a private network here, else why not (tried
    once per process, in a child: a namespace cannot be left once entered)."""
    try:
        done = subprocess.run([sys.executable, "-m", "reticulum_grid.node.private_net"], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the probe did not run: {e}"
    return "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["the probe failed"])[-1]


def serve_dials(pair: socket.socket, port: int) -> None:
    """The guard's side, inside the namespace: answer each byte read from
    ``pair`` with a socket connected to 127.0.0.1:``port`` (or DIAL_FAILED).
    Returns when the tower's end closes."""
    while pair.recv(1):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5.0) as conn:
                socket.send_fds(pair, [DIAL_OK], [conn.fileno()])
        except OSError:
            pair.sendall(DIAL_FAILED)


class Dialer:
    """The tower's side: ``dial()`` returns a new connection to the server in
    the guard's namespace. ``pair``: the tower's end of the socket pair."""

    def __init__(self, pair: socket.socket) -> None:
        self.pair = pair
        self._lock = threading.Lock()

    def dial(self, timeout_s: float = 10.0) -> socket.socket:
        """A connected socket (blocking). Raises OSError when the server does not accept."""
        with self._lock:
            self.pair.settimeout(timeout_s)
            self.pair.sendall(b"?")
            status, fds, _, _ = socket.recv_fds(self.pair, 1, 1)
        if status != DIAL_OK or not fds:
            for fd in fds:
                os.close(fd)
            raise OSError("the RPC server's namespace refused the connection" if status else "the guard is gone")
        sock = socket.socket(fileno=fds[0])
        sock.settimeout(None)
        return sock

    def close(self) -> None:
        self.pair.close()


def _probe() -> int:
    try:
        enter()
        with socket.create_server(("127.0.0.1", 0)) as server:
            socket.create_connection(server.getsockname(), timeout=2.0).close()
    except OSError as e:
        print(f"no private network here: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_probe())
