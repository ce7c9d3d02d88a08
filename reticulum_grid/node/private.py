"""Keeping what a tower writes to its own user: 0600 files, 0700 folders.

A tower's folder holds its identity and RNS's keys (``rns/storage``), the
datasets users pushed, adapters trained on them and its logs, none of them for
other users of the machine. ``keep_private(directory)`` sets the process's
umask to 077, so that everything written from then on (by this package, by RNS,
by llama.cpp and training children, which inherit it) is created private, and
takes group and other permissions off what is already in ``directory`` (a
tower that ran before this rule, or files put there before it started).
Symbolic links are left alone (their targets may be the user's own files).
"""

import os
from pathlib import Path

#: Permission bits of group and others.
SHARED_BITS = 0o077


def keep_private(directory: Path) -> None:
    """umask 077 for this process, and no group/other bits on ``directory`` or anything under it."""
    os.umask(SHARED_BITS)
    directory.mkdir(parents=True, exist_ok=True)
    _tighten(directory)
    for root, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            _tighten(Path(root) / name)


def _tighten(path: Path) -> None:
    try:
        mode = path.lstat().st_mode
        if not path.is_symlink() and mode & SHARED_BITS:
            os.chmod(path, mode & ~SHARED_BITS & 0o7777)
    except FileNotFoundError:  # removed meanwhile (a partial blob that finished)
        pass
