"""Towers and RNS transport nodes as local processes on loopback, each with a
fresh config dir: used by the demo, the benchmarks and the tests.

Each tower is its own process (RNS allows one instance per process) with its
own config dir, identity and free port; nothing but 127.0.0.1 is touched.

Clients trust only the towers their ``client.toml`` names (node/trust.py).
``trust_local_towers(home)`` makes the client at ``home`` trust the towers this
process starts, as a user would run ``rngrid trust`` for each of their own:
the demo and the benchmarks trust theirs, the test harness its own (a tower
started with ``trusted=False`` plays a stranger).
"""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

from reticulum_grid.node import config, identity, trust

#: Towers this process started as trusted ({identity hash hex: name}), and the
#: client homes that trust every one of them as they start.
_started: dict[str, str] = {}
_trusting: list[Path] = []


def trust_local_towers(home: str | os.PathLike[str], follow: bool = True) -> None:
    """Make the client at ``home`` trust every tower this process started (with
    ``trusted=True``) and, with ``follow``, every one it starts from now on.
    Entries take the towers' announced names (two test towers may share one)."""
    path = Path(home) / "client.toml"
    if follow and path not in _trusting:
        _trusting.append(path)
    if _started:
        trust.trust_many(path, {h: "" for h in _started})


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float) -> bool:
    """True once 127.0.0.1:port accepts connections (bounded by ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


class LocalProcess:
    """A child process with its own directory, log file and loopback port."""

    def __init__(self, directory: str | os.PathLike[str], name: str, port: int | None) -> None:
        self.dir = Path(directory)
        self.name = name
        self.port = port
        self.log_path = self.dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 60.0) -> Self:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(self.argv(), stdout=self._log, stderr=subprocess.STDOUT, env=env)
        if self.port and not wait_port(self.port, timeout):
            self.stop()
            raise RuntimeError(f"{self.name} did not listen within {timeout:.0f} s; see {self.log_path}")
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self._close_log()

    def _close_log(self) -> None:
        if self._log:
            self._log.close()
            self._log = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class TransportProcess(LocalProcess):
    """An RNS transport node (``rngrid transport``) listening on a free loopback
    port and connecting to ``connect`` ("host:port" list)."""

    def __init__(self, root: str | os.PathLike[str], name: str, connect: Iterable[str] = ()) -> None:
        super().__init__(Path(root) / name, name, free_port())
        self.connect = list(connect)

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "reticulum_grid", "transport", "--config-dir", str(self.dir), "--listen",
                self.address] + [arg for c in self.connect for arg in ("--connect", c)]


class TowerProcess(LocalProcess):
    """``python -m reticulum_grid tower`` in its own directory under ``root``.

    ``models``: {alias: gguf path}; ``allow``: {identity hex: [roles]};
    ``sections``: extra config tables (e.g. announce={"floor_s": 1});
    ``trusted``: the clients of trust_local_towers trust it once it starts."""

    def __init__(self, root: str | os.PathLike[str], name: str, models: Mapping[str, Any],
                 allow: Mapping[str, Sequence[str]] | None = None, connect: Iterable[str] = (), listen: bool = True,
                 threads: int = 1, trusted: bool = True, **sections: Any) -> None:
        super().__init__(Path(root) / name, name, free_port() if listen else None)
        self.trusted = trusted
        self.config_path = self.dir / "tower.toml"
        sections.setdefault("announce", {"floor_s": 1, "heartbeat_s": 600})
        # Several towers share this machine: one llama.cpp thread each keeps their
        # runners' spinning thread barriers from fighting over the cores.
        config.write_tower(self.config_path, name, models, listen=self.address if listen else "",
                           connect=connect, allow=allow, threads=threads, **sections)

    @property
    def identity_hash(self) -> str:
        """The tower's identity hash (hex; its identity file is created if missing)."""
        return identity.load_or_create(self.dir / "identity").hash.hex()

    def trust_line(self) -> str:
        """The command a client runs to trust this tower."""
        return f"rngrid trust {self.identity_hash} --name {self.name}"

    def start(self, timeout: float = 60.0) -> Self:
        if self.trusted:
            try:
                _started[self.identity_hash] = self.name
            except identity.IdentityError:
                pass  # the tower refuses to start; nothing to trust
            else:
                for path in _trusting:
                    if path.parent.is_dir():
                        trust.trust_many(path, {self.identity_hash: ""})
        return super().start(timeout)

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "reticulum_grid", "-v", "tower", "--config", str(self.config_path)]
