"""What this client measured of towers, kept in its home so the next process knows it too.

``HOME/measured.json`` holds, per tower (destination hash, hex): the tokens/s
its streams reached on this client's clock (router.py ranks by it), the kind
of hardware it announced then (backend and device: a claim from a tower never
measured is bounded by what its kind reached here), when it was last
measured, the smallest split part (MiB) that failed to load there while
it claimed to lend more (client/split.py bounds its lent memory by it), and
the tokens/s it last announced to a process ranking it (a tower heard once
and never measured: a later process that hears a measured-slow tower first
knows this one may rank above it, router.HealthBook.faster_unheard).

Each `rngrid` command is a process of its own: without this file every one of
them would rank towers by what they announce, and a trusted tower announcing a
false speed would win every request. The file is written atomically (a
temporary file, then a rename; mode 0600), holds MAX_TOWERS towers at most
(the most recently changed), forgets a figure after MAX_AGE_S, and is
re-read before each write so processes sharing the home keep each other's
figures. A corrupt or unreadable file is logged and counts as empty: measuring
starts again, nothing else fails.
"""

import json
import logging
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

log = logging.getLogger("rngrid.client.measured")

FILE = "measured.json"
VERSION = 1
#: Towers kept at most (the most recently changed): bounds the file (~170 bytes a tower).
MAX_TOWERS = 256
#: A figure older than this is forgotten (seconds): hardware, load and models change.
MAX_AGE_S = 7 * 86400.0
#: Larger files are not read (bytes): MAX_TOWERS entries take ~40 KiB.
MAX_FILE_BYTES = 1 << 20
#: Device names are cut to this many characters (announce/caps.py allows more; this is a key, not a label).
MAX_DEVICE = 64


@dataclass(frozen=True)
class Measured:
    """One tower's figures: ``tokens_per_s`` (0: never measured), ``kind``
    ("backend/device"), ``at`` (Unix time of the last change), ``lend_failed_mib``
    (0: no split part failed to load there), ``announced`` (the tokens/s it
    last announced when ranked here; 0: none heard)."""
    tokens_per_s: float = 0.0
    kind: str = ""
    at: float = 0.0
    lend_failed_mib: int = 0
    announced: float = 0.0


def kind_of(backend: str, device: str) -> str:
    """The key towers of one kind share: "backend/device" (device cut to MAX_DEVICE)."""
    return f"{backend}/{device[:MAX_DEVICE]}"


class MeasuredRates:
    """The measured figures in ``path`` (a JSON file, see the module doc; None:
    kept in memory only), read once at creation; ``record``, ``lend_failed``
    and ``lend_held`` change one tower and write."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._towers = _read(self.path) if self.path is not None else {}

    def get(self, destination_hash: bytes) -> Measured:
        return self._towers.get(destination_hash.hex(), Measured())

    def towers(self) -> dict[bytes, Measured]:
        """{destination hash: Measured} of every tower kept."""
        with self._lock:
            return {bytes.fromhex(k): m for k, m in self._towers.items()}

    def best_of_kind(self, kind: str) -> float:
        """The most tokens/s any tower of ``kind`` reached here (0.0: none measured)."""
        with self._lock:
            return max((m.tokens_per_s for m in self._towers.values() if m.kind == kind), default=0.0)

    def record(self, destination_hash: bytes, kind: str, tokens_per_s: float) -> None:
        """The tower's rate is now ``tokens_per_s`` (on hardware of ``kind``)."""
        self._change({destination_hash: {"tokens_per_s": tokens_per_s, "kind": kind}})

    def heard(self, announced: dict[bytes, tuple[str, float]]) -> None:
        """Towers were ranked here: {destination hash: (kind, announced tokens/s)}.
        Writes only when some tower is new or its kind or claim changed. A
        measured tower's figure keeps its age: hearing it is no measurement."""
        changes = {h: {"kind": kind, "announced": tps} for h, (kind, tps) in announced.items()
                   if (self.get(h).kind, self.get(h).announced) != (kind, tps)}
        if changes:
            self._change(changes, keep_measured_age=True)

    def lend_failed(self, destination_hash: bytes, mib: int) -> None:
        """A split part of ``mib`` MiB failed to load on the tower (the smallest such part is kept)."""
        known = self.get(destination_hash).lend_failed_mib
        self._change({destination_hash: {"lend_failed_mib": min(mib, known) if known else mib}})

    def lend_held(self, destination_hash: bytes, mib: int) -> None:
        """A split part of ``mib`` MiB loaded on the tower: a failure below that no longer counts."""
        if 0 < self.get(destination_hash).lend_failed_mib <= mib:
            self._change({destination_hash: {"lend_failed_mib": 0}})

    def _change(self, changes: dict[bytes, dict[str, Any]], keep_measured_age: bool = False) -> None:
        """Set ``changes`` ({destination hash: {field: value}}) and write once;
        ``at`` becomes now, except for a measured tower's with ``keep_measured_age``."""
        with self._lock:
            # What other processes sharing the home wrote meanwhile, then this change.
            towers = _read(self.path) if self.path is not None else dict(self._towers)
            for destination_hash, fields in changes.items():
                key = destination_hash.hex()
                known = towers.get(key) or self._towers.get(key) or Measured()
                at = known.at if keep_measured_age and known.tokens_per_s else time.time()
                towers[key] = replace(known, at=at, **fields)
            self._towers = dict(sorted(towers.items(), key=lambda item: item[1].at, reverse=True)[:MAX_TOWERS])
            if self.path is not None:
                _write(self.path, self._towers)


def _read(path: Path) -> dict[str, Measured]:
    """{destination hex: Measured} from ``path``; {} when it is missing or
    unreadable (logged); entries that are malformed or too old are dropped."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("towers"), dict):
            raise ValueError(f"not a version {VERSION} map of towers")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        log.warning("%s is unreadable (%s): measuring towers again from scratch", path, e)
        return {}
    oldest = time.time() - MAX_AGE_S
    towers = {}
    for key, raw in doc["towers"].items():
        entry = _entry(key, raw)
        if entry is not None and entry.at >= oldest:
            towers[key] = entry
    return dict(sorted(towers.items(), key=lambda item: item[1].at, reverse=True)[:MAX_TOWERS])


def _entry(key: object, raw: object) -> Measured | None:
    """One tower's Measured from the file, or None when any field is off."""
    if not isinstance(key, str) or len(key) != 32 or not isinstance(raw, dict):
        return None
    try:
        bytes.fromhex(key)
    except ValueError:
        return None
    rate, at, failed, announced = (_number(raw.get(k, 0))
                                   for k in ("tokens_per_s", "at", "lend_failed_mib", "announced"))
    kind = raw.get("kind")
    if rate is None or at is None or failed is None or announced is None or not isinstance(kind, str) \
            or len(kind) > MAX_DEVICE + 16:
        return None
    return Measured(rate, kind, at, int(failed), announced)


def _number(value: object) -> float | None:
    """``value`` as a finite float >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _write(path: Path, towers: dict[str, Measured]) -> None:
    """Write ``towers`` to ``path`` atomically, readable by this user only; a
    failure (a full disk, a read-only home) is logged: figures stay in memory."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": VERSION, "towers": {k: asdict(m) for k, m in towers.items()}}, f)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("cannot keep measured tower figures in %s: %s", path, e)
        tmp.unlink(missing_ok=True)
