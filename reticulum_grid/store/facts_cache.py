"""What was read once from a large file, kept on disk for the next process:
one small JSON file per (path, size, modification time, format) under the
cache folder (``RNGRID_CACHE``/gguf-facts, see node/cache.py).

Reading a GGUF's metadata with the gguf library parses every field, the
whole token list too: 2-6 s of CPU for the bundled model's 49,152 tokens,
more for a 128k vocabulary, in every tower start. A changed file (size or
modification time) misses; an unreadable or malformed entry is read again.
At most ``MAX_ENTRIES`` entries are kept, the least recently written go first.
"""

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from reticulum_grid.node.cache import cache_root

MAX_ENTRIES = 256


def folder() -> Path:
    return cache_root() / "gguf-facts"


def _entry(path: str, form: str) -> Path:
    stat = os.stat(path)
    key = f"{os.path.realpath(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\0{form}"
    return folder() / f"{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}.json"


def load(path: str, form: str) -> dict[str, Any] | None:
    """The values saved for the file at ``path`` as it is now, in format
    ``form`` (a caller's name for its set of fields), or None."""
    try:
        values = json.loads(_entry(path, form).read_text())
    except (OSError, ValueError):
        return None
    return values if isinstance(values, dict) else None


def save(path: str, form: str, values: dict[str, Any]) -> None:
    """Keep ``values`` (JSON-able) for the file at ``path``; a cache that
    cannot be written is skipped (the next process reads the file again)."""
    try:
        target = _entry(path, form)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, suffix=".tmp", delete=False) as out:
            json.dump(values, out)
        os.replace(out.name, target)  # two towers starting at once each write whole
        _prune(target.parent)
    except OSError:
        return


def _prune(where: Path) -> None:
    for old in sorted(where.glob("*.json"), key=_written)[:-MAX_ENTRIES]:
        old.unlink(missing_ok=True)


def _written(entry: Path) -> float:
    try:
        return entry.stat().st_mtime
    except OSError:  # pruned by another process meanwhile
        return 0.0
