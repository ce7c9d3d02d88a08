"""Training jobs from the Grid client: picking towers (one, or several data-parallel), submit, list, watch, cancel.

A mixin of ``Grid`` (client/grid.py): it uses the Grid's table, store and Links.
"""

import os
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from announce.table import TowerEntry
from links.wire import LINK_LOST, Code, WireError
from reticulum_grid.store.sync import Progress
from reticulum_grid.training.request import TrainRequest

if TYPE_CHECKING:
    from reticulum_grid.client.parts import GridParts
    _Parts = GridParts
else:
    _Parts = object  # the mixin's base for the type checker only (client/parts.py)


def train_towers(grid: "GridParts", towers: str | Sequence[str], base: str | None = None) -> list[TowerEntry]:
    """Entries for a multi-tower job: ``towers`` is a list of names/hashes or
    ``"auto:N"`` (the N best towers granting us ``train`` that have a data-plane
    address). Raises WireError (no_tower, not_allowed, bad_request)."""
    usable = {e.destination_hash: e for e, full in grid.caps_full(grid.towers(wait=5.0))
              if "train" in full.roles and full.dataplane}
    if isinstance(towers, str) and towers.startswith("auto:"):
        try:
            count = int(towers[5:])
        except ValueError:
            raise WireError(Code.BAD_REQUEST, f"towers {towers!r}: give auto:N with a number") from None
        ranked = sorted(usable.values(), key=lambda e: (e.caps.load.jobs > 0, base is not None and e.caps.model(
            base) is None, -e.caps.hardware.memory_free_mib))
        if count < 1 or len(ranked) < count:
            raise WireError(Code.NO_TOWER, f"{len(ranked)} tower(s) heard grant this identity train and have a "
                                           f"[network] dataplane address; {towers} asks for {count}")
        return ranked[:count]
    names = towers.split(",") if isinstance(towers, str) else list(towers)
    entries = [grid.find_tower(name.strip()) for name in names if name.strip()]
    for entry in entries:
        if entry.destination_hash not in usable:
            raise WireError(Code.NOT_ALLOWED, f"{entry.name} does not grant this identity train or has no "
                                              "[network] dataplane address: it cannot take part")
    if len({e.destination_hash for e in entries}) != len(entries):
        raise WireError(Code.BAD_REQUEST, "a tower is named twice in towers")
    return entries


class JobCommands(_Parts):
    """Training-job methods of ``Grid``."""

    def train_tower(self, tower: str | None = None, base: str | None = None) -> TowerEntry:
        """``tower`` by name, or (``auto``/None) the live tower granting us ``train``
        with the most free memory, towers already training last."""
        if tower and tower != "auto":
            return self.find_tower(tower)
        heard = self.towers(wait=5.0)
        entries = [e for e, full in self.caps_full(heard) if "train" in full.roles]
        if not entries:
            # Towers that are there but refuse us: not_allowed says what to fix.
            raise WireError(Code.NOT_ALLOWED if heard else Code.NO_TOWER,
                            f"no tower heard ({len(heard)}) grants this identity the train role; a tower's admin "
                            f"can run: rngrid allow {self.identity_hash} --role train")
        return min(entries, key=lambda e: (e.caps.load.jobs > 0, base is not None and e.caps.model(base) is None,
                                           -e.caps.hardware.memory_free_mib))

    def train(self, request: TrainRequest | Mapping[str, Any], data_path: str | os.PathLike[str] | None = None,
              tower: str | None = None, progress: Progress | None = None,
              towers: str | Sequence[str] | None = None) -> tuple[TowerEntry, str]:
        """Submit a ``genome/train`` job: ``request`` a TrainRequest or its map
        (training/request.py; a map is checked here, before anything is sent).
        ``data_path``: a local JSONL file, sent to the tower(s) first. ``towers``:
        train on several towers at once, data-parallel: a list of names or
        hashes (the first coordinates) or ``"auto:N"``; the base model and
        dataset are synced to each first. Returns (coordinating tower entry, job
        id). Raises WireError."""
        asked = request if isinstance(request, TrainRequest) else TrainRequest.from_map(request)
        entries = train_towers(self, towers, asked.base) if towers else [self.train_tower(tower, asked.base)]
        for i, entry in enumerate(entries):
            if entry.caps.model(asked.base) is None:
                entries[i] = self.sync_to(entry, asked.base, "model", progress)
        if data_path is not None:
            info = self.store.add_file(data_path, kind="dataset")
            for entry in entries:
                self.push(info.hex, entry, progress=progress)
            asked = replace(asked, dataset=info.hex)
            if not info.aliases:  # the tower holds it now: nothing here refers to it
                self.store.remove(info.hex)
        if len(entries) > 1:
            asked = replace(asked, towers=tuple(e.destination_hash.hex() for e in entries[1:]))
        # A fresh submit_id makes this request distinct, so the tower answers a copy
        # resent after a lost reply with the same job instead of a second one.
        asked = replace(asked, submit_id=secrets.randbelow(1 << 63))
        return entries[0], self.connection(entries[0]).request("genome/train", asked.to_map())["job_id"]

    def job_tower(self, job_id: str, tower: str | None = None) -> TowerEntry:
        """The tower that runs ``job_id`` (asking every live tower when none is named)."""
        entries = [self.find_tower(tower)] if tower else self.towers(wait=5.0)
        refused: list[str] = []
        for entry in entries:
            try:
                self.connection(entry).request("jobs/status", {"job_id": job_id})
                return entry
            except WireError as e:
                if not tower and e.code in {Code.UNKNOWN_JOB, Code.NOT_ALLOWED, *LINK_LOST}:
                    refused.append(e.code)
                    continue
                raise
        if refused and all(code == Code.NOT_ALLOWED for code in refused):
            raise WireError(Code.NOT_ALLOWED, f"no tower heard lets this identity see job {job_id!r}; a tower's "
                                              f"admin can run: rngrid allow {self.identity_hash} --role train")
        raise WireError(Code.UNKNOWN_JOB, f"no tower heard runs job {job_id!r}")

    def jobs(self, tower: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        """[(tower name, job map)] of this client's jobs on every tower (or one)."""
        out: list[tuple[str, dict[str, Any]]] = []
        for entry in ([self.find_tower(tower)] if tower else self.towers(wait=5.0)):
            try:
                out += [(entry.name, job) for job in self.connection(entry).request("jobs/status", {})["jobs"]]
            except WireError as e:
                if tower or e.code not in {Code.NOT_ALLOWED, *LINK_LOST}:
                    raise
        return out

    def watch(self, job_id: str, tower: str | None = None) -> Iterator[dict[str, Any]]:
        """Iterator of a job's events until it ends; re-attaches from anywhere."""
        return self.connection(self.job_tower(job_id, tower)).watch_job(job_id)

    def cancel_job(self, job_id: str, tower: str | None = None) -> dict[str, Any]:
        return self.connection(self.job_tower(job_id, tower)).request("jobs/cancel", {"job_id": job_id})["job"]
