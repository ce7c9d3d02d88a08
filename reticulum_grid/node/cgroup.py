"""The memory limit a container (a Linux control group) puts on this process.

psutil reports the host's RAM; a tower in a container (``docker run
--memory``, a systemd slice, a Kubernetes pod) may use far less. The limit is
the tightest ``memory.max`` (cgroup v2) or ``memory.limit_in_bytes`` (v1) on
the process's group and the groups above it (a parent's limit holds for its
children); its use is the group's working set, ``memory.current`` (v2) or
``memory.usage_in_bytes`` (v1) less the reclaimable page cache
(``inactive_file`` in ``memory.stat``), as ``docker stats`` counts it. Paths
come from ``/proc/<pid>/cgroup`` (man 7 cgroups). Anywhere else (no Linux,
no limit, files unreadable) there is none.
"""

from dataclasses import dataclass
from pathlib import Path

#: A v1 limit at or above this is "no limit" (the kernel writes PAGE_COUNTER_MAX pages, about 2**63 bytes).
V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class MemoryLimit:
    """``limit``: bytes the group may use; ``used``: its working set (bytes)."""
    limit: int
    used: int

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)


def memory_limit(pid: int | str = "self", proc: Path = Path("/proc"),
                 root: Path = Path("/sys/fs/cgroup")) -> MemoryLimit | None:
    """The tightest memory limit on process ``pid`` and what its group uses,
    or None when no limit applies. ``proc`` and ``root``: where /proc and the
    cgroup mounts are (tests give a tree of their own)."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    groups = dict(_entry(line) for line in lines if line.count(":") >= 2)
    if "memory" in groups:  # v1: the memory controller's own hierarchy
        return _tightest(root / "memory", groups["memory"], "memory.limit_in_bytes", "memory.usage_in_bytes",
                         "total_inactive_file")
    if "" in groups:  # v2: one unified hierarchy
        return _tightest(root, groups[""], "memory.max", "memory.current", "inactive_file")
    return None


def _entry(line: str) -> tuple[str, str]:
    _, controllers, path = line.split(":", 2)
    names = [c for c in controllers.split(",") if c]
    return ("memory" if "memory" in names else "" if not names else names[0]), path


def _tightest(mount: Path, path: str, limit_file: str, usage_file: str, inactive_key: str) -> MemoryLimit | None:
    best = None
    folder = mount / path.strip("/")
    while True:
        limit = _number(folder / limit_file)
        if limit is not None and limit < V1_UNLIMITED and (best is None or limit < best.limit):
            used = _number(folder / usage_file)
            if used is not None:
                best = MemoryLimit(limit, max(0, used - _stat(folder / "memory.stat", inactive_key)))
        if folder == mount or mount not in folder.parents:
            return best
        folder = folder.parent


def _number(path: Path) -> int | None:
    """The integer in a cgroup file; None for "max", a missing or unreadable file."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0
