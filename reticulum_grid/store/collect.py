"""Collecting what nothing refers to in a BlobStore.

A store keeps a blob while an alias names it (or a caller says it is in use,
e.g. a training job's dataset). A blob that never had an alias or lost its
last one (a dataset a tower refused, a pull by id, the old version of a moved
alias) and a partial transfer that nobody continued are deleted once they
have been left alone for ``max_age_s`` (UNREFERENCED_S by default): long
enough for an interrupted transfer to resume the next day, short enough that
a disk does not fill with leftovers. A file registered in place is only
forgotten, never deleted.
"""

import logging
import shutil
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reticulum_grid.store.blobstore import BlobStore

#: Blob ids (bytes) and data paths (str) in use although no alias names them.
InUse = Collection[bytes | str]

log = logging.getLogger("rngrid.store")

#: How long a blob without aliases or an untouched partial transfer is kept (seconds).
UNREFERENCED_S = 24 * 3600


def collect(store: "BlobStore", max_age_s: float = UNREFERENCED_S, in_use: InUse = frozenset(),
            now: float | None = None) -> list[str]:
    """Delete what nothing referred to for ``max_age_s`` seconds. ``in_use``:
    blob ids (bytes) and data paths (str) to keep although they have no alias.
    Returns the hex ids of the blobs and partial transfers removed."""
    now = time.time() if now is None else now
    removed: list[str] = []
    with store._lock:
        named = set(store._index["aliases"].values())
    for directory in sorted((store.root / "objects").iterdir()):
        h = directory.name
        if h in named or _used(store, h, in_use) or now - _age_mark(directory) < max_age_s:
            continue
        with store._lock:  # an alias set meanwhile keeps it
            if h in store._index["aliases"].values():
                continue
            _forget(store, h, directory)
        removed.append(h)
    for directory in sorted((store.root / "partial").iterdir()):
        if now - _age_mark(directory) < max_age_s:
            continue
        with store._lock:  # a transfer resuming it now keeps it (receive() takes this lock)
            if any(blob_id.hex() == directory.name for blob_id in store._receiving):
                continue
            shutil.rmtree(directory, ignore_errors=True)
        removed.append(directory.name)
        log.info("collected partial transfer %s: untouched for a while", directory.name[:16])
    return removed


def _used(store: "BlobStore", h: str, in_use: InUse) -> bool:
    if _is_hex(h) and bytes.fromhex(h) in in_use:
        return True
    path = store._index["external"].get(h, {}).get("path") or str(store.root / "objects" / h / "data")
    return path in in_use


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
        return True
    except ValueError:
        return False


def _age_mark(directory: Path) -> float:
    """Newest mtime of the directory and its files (a transfer's have-map
    changes with every chunk)."""
    try:
        return max([directory.stat().st_mtime] + [p.stat().st_mtime for p in directory.iterdir()])
    except OSError:
        return time.time()  # vanished or unreadable now: look again next time


def _forget(store: "BlobStore", h: str, directory: Path) -> None:
    store._index["kinds"].pop(h, None)
    store._index["external"].pop(h, None)
    if _is_hex(h):
        store._manifests.pop(bytes.fromhex(h), None)
    store._save_index()
    shutil.rmtree(directory, ignore_errors=True)
    log.info("collected blob %s: no alias for a while", h[:16])


class Collector:
    """Runs collect() at start and then every ``max_age_s / 4`` (1 s .. 1 h)
    on a daemon thread. ``in_use()`` returns what collect()'s ``in_use`` takes."""

    def __init__(self, store: "BlobStore", max_age_s: float = UNREFERENCED_S,
                 in_use: Callable[[], InUse] = frozenset) -> None:
        self.store, self.max_age_s, self.in_use = store, max_age_s, in_use
        self._stop = threading.Event()

    def start(self) -> "Collector":
        threading.Thread(target=self._run, name="rngrid-collect", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        period = min(3600.0, max(1.0, self.max_age_s / 4))
        while True:
            try:
                collect(self.store, self.max_age_s, self.in_use())
            except Exception:  # a failed pass must not end collecting for good
                log.exception("collecting unreferenced blobs failed")
            if self._stop.wait(period):
                return
