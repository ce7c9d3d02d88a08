"""A TOML file's parsed value, read again whenever the file changes on disk.

``rngrid allow`` and ``rngrid trust`` edit a running tower's or gateway's
config file; the process sees the change at its next look, without a
restart. The files are replaced on every write (node/config.py write_toml: a
new inode, and a size that moves with each entry), so the stamp is (inode,
size, mtime, ctime): two writes within one tick of the file system's clock
still differ. A file that stops parsing keeps the last good value; ``on_error``
hears why.
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from reticulum_grid.node.config_values import ConfigError

T = TypeVar("T")
#: What identifies one version of a file: (inode, size, mtime ns, ctime ns); None when it is absent.
Stamp = tuple[int, int, int, int] | None


class LiveToml(Generic[T]):
    """``load(path)`` -> T (raising ConfigError or OSError), kept current:
    ``value`` reads the file again when its stamp changed. ``initial``: the
    value already loaded from it (None: load now)."""

    def __init__(self, path: str | os.PathLike[str], load: Callable[[Path], T], initial: T | None = None,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        self.path = Path(path)
        self._load = load
        self._on_error = on_error
        self.stamp = self._stat()
        self._value = load(self.path) if initial is None else initial

    def _stat(self) -> Stamp:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def fresh(self) -> bool:
        """Read the file again if it changed. True when the value changed."""
        stamp = self._stat()
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        try:
            self._value = self._load(self.path)
        except (ConfigError, OSError) as e:
            if self._on_error is not None:
                self._on_error(e)
            return False
        return True

    @property
    def value(self) -> T:
        self.fresh()
        return self._value
