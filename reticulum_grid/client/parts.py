"""What the parts of ``Grid`` (client/grid.py: its mixins, and the modules
that take the grid as their first argument: busy, embeddings, estimates,
liveness, split, stream, voice) use of it, for the type checker: the Grid's
state and the methods one part calls on another. No part imports grid.py. At run
time the mixins derive from ``object`` alone; under the type checker they
derive from GridParts, so each reads ``self.table``, ``self.caps_full(...)``
and the rest with their types. Grid itself provides every member."""

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from announce.capsfull import CapsFull
from announce.table import TowerEntry, TowerTable
from links.wire import WireError
from reticulum_grid.client.router import Choice, HealthBook
from reticulum_grid.node.connection import TowerConnection
from reticulum_grid.store.blobstore import BlobStore
from reticulum_grid.store.sync import Progress

class LivenessParts(Protocol):
    """What the other parts ask of the client's liveness (client/liveness.py)."""

    def attempt_timeout(self, entry: TowerEntry) -> float: ...

    def refresh(self, entries: list[TowerEntry], max_age_s: float) -> None: ...

    def failed(self, entry: TowerEntry, error: WireError) -> None: ...

    def look_again(self, model: str, tried: Mapping[bytes, float], adapter: str | None = None,
                   timeout: float = 6.0) -> list[Choice]: ...


class GridParts(Protocol):
    home: Path
    identity: Any  # an RNS.Identity (RNS ships no types)
    store: BlobStore
    table: TowerTable
    health: HealthBook
    liveness: LivenessParts
    connections: dict[bytes, TowerConnection]
    needs: dict[str, int]
    model_facts: dict[str, dict[str, int]]
    served: dict[bytes, int]
    dataplanes: dict[bytes, bool]
    drafts: dict[bytes, dict[str, int]]

    @property
    def identity_hash(self) -> str: ...

    def towers(self, wait: float = 5.0, quiet_s: float = 1.5) -> list[TowerEntry]: ...

    def find_tower(self, name_or_hash: str, timeout: float = 15.0) -> TowerEntry: ...

    def ping(self, force: bool = False) -> None: ...

    def discover(self, ready: Callable[[list[TowerEntry]], object], timeout: float,
                 settle_s: float = 0.3) -> list[TowerEntry]: ...

    def refresh(self, entries: list[TowerEntry], max_age_s: float = ...) -> None: ...

    def rank(self, model: str, adapter: str | None = None, tower: str | None = None, timeout: float = 15.0,
             settle_s: float = 0.3, complete: bool = False) -> list[Choice]: ...

    def connection(self, entry: TowerEntry) -> TowerConnection: ...

    def local_blob(self, name: str) -> bytes | None: ...

    def caps_full(self, entries: Sequence[TowerEntry], timeout: float = 10.0) -> list[tuple[TowerEntry, CapsFull]]: ...

    def caps_full_timed(self, entries: Sequence[TowerEntry],
                        timeout: float = 10.0) -> list[tuple[TowerEntry, CapsFull, float]]: ...

    def ask_full(self, entry: TowerEntry, timeout: float = 30.0,
                 link_timeout: float = 15.0) -> tuple[TowerEntry, CapsFull]: ...

    def sync_to(self, entry: TowerEntry, name: str, kind: str = "model",
                progress: Progress | None = None) -> TowerEntry: ...

    def push(self, name: str, to_tower: str | TowerEntry, alias: str | None = None,
             progress: Progress | None = None, max_seconds: float | None = ...) -> dict[str, Any]: ...
