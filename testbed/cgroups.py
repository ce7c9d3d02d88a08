"""A child memory cgroup of the test process's own, for a tower that must
see less memory than the machine has (tests/discovery/test_routing_memory.py).

cgroup v1's memory controller, or v2 where the memory controller is on for
the children of this process's group; made and removed by the test (root)."""

import contextlib
import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_group():
    """(folder of this process's memory cgroup, "v1" or "v2"). Raises OSError."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return ROOT / "memory" / path.strip("/"), "v1"
    for line in lines:
        if line.startswith("0::"):
            folder = ROOT / line[3:].strip("/")
            if "memory" not in (folder / "cgroup.subtree_control").read_text().split():
                raise OSError(f"the memory controller is off for the children of {folder}")
            return folder, "v2"
    raise OSError("no memory cgroup for this process")


@contextlib.contextmanager
def child_group(name, limit_bytes):
    """A child memory cgroup limited to ``limit_bytes``; yields a function that
    moves a process (pid) into it. Removed on exit, once its processes left.
    Raises OSError where it cannot be made."""
    parent, version = _own_group()
    folder = parent / f"rngrid-test-{os.getpid()}-{name}"
    folder.mkdir()
    try:
        (folder / ("memory.limit_in_bytes" if version == "v1" else "memory.max")).write_text(str(limit_bytes))

        def move(pid):
            (folder / "cgroup.procs").write_text(str(pid))

        yield move
    finally:
        with contextlib.suppress(OSError):
            folder.rmdir()
