"""Processes a test run left behind, for the session-end check in conftest.py.

The test process makes itself a child subreaper (Linux), so a process whose
parent died (a trainer worker of a killed tower, a tower behind a killed
transport) is re-parented to it instead of init and still counts as ours.
Elsewhere only the living descendants are seen.
"""

import ctypes
import os
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PROC = Path("/proc")


def become_subreaper():
    """True when orphaned descendants will be re-parented to this process."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid):
    """(ppid, state, command line) of a living process, or None."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()  # the command name may hold spaces and ")"
    return int(fields[1]), fields[0], cmdline.strip()


def alive(pid):
    """True while ``pid`` runs (a zombie has ended)."""
    info = _stat(pid)
    return info is not None and info[1] != "Z"


def descendants(root=None):
    """{pid: command line} of the living (not zombie) descendants of ``root``
    (default: this process). Empty where /proc is missing."""
    root = root or os.getpid()
    if not PROC.is_dir():
        return {}
    table = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            info = _stat(int(entry.name))
            if info:
                table[int(entry.name)] = info
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, state, cmdline) in table.items():
            if ppid == parent and pid not in found:
                if state != "Z":
                    found[pid] = cmdline
                frontier.append(pid)
    return found


def reap():
    """Collect exited children (zombies) so they stop counting."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def leftovers(grace_s=5.0):
    """Descendants still alive after ``grace_s`` seconds (a process told to stop
    a moment ago gets that long to go)."""
    deadline = time.monotonic() + grace_s
    while True:
        reap()
        left = descendants()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def end(*procs, timeout=5.0):
    """Kill and wait for every subprocess.Popen in ``procs`` that still runs
    (for ``finally:`` blocks: a failed assertion must not leave one behind)."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            try:
                proc.wait(timeout)
            except Exception:
                pass
