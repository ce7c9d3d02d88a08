"""What a tower's capabilities (blobs, jobs, dp, inference, split, shard, voice), its
Link sessions and the daemon's own command handlers use of the ``Tower``
(tower/daemon.py), for the type checker; what one capability asks of another
is a small protocol here, so no capability module imports another's.
``Tower`` makes its parts in ``start()`` (None until then); they are read only while serving commands and announcing, once
``start()`` made them all, so here they are not optional. The announcer stays
optional: a capability's callbacks may run while ``start()`` still builds it."""

from typing import TYPE_CHECKING, Any, Protocol

from announce.announcer import Announcer
from reticulum_grid.inference.registry import ModelRegistry, ModelSlot
from reticulum_grid.node.allowlist import LiveAllowList
from reticulum_grid.node.config import TowerConfig
from reticulum_grid.node.hardware import CachedProbe
from reticulum_grid.store.blobstore import BlobStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from reticulum_grid.node.dataplane import Forwarder
    from reticulum_grid.inference.facts import ModelFactsReader
    from reticulum_grid.inference.generation import Generation
    from links.usage import StreamUsage


class SplitServing(Protocol):
    """What a part asks of the tower's split capability (tower/split.py)."""

    def inference(self, session: Any, request: dict[str, Any]) -> dict[str, Any]: ...  # session: a LinkSession

    def draft_for(self, slot: ModelSlot) -> str: ...


class ShardLending(Protocol):
    """What a part asks of the tower's worker end (tower/shard.py)."""

    def lend_to_self(self, owners: "Callable[[], list[int]]") -> "tuple[Forwarder, Callable[[], None]]": ...


class UsageOf(Protocol):
    """What a part asks of the tower's inference capability (tower/inference.py)."""

    def usage(self, result: "Generation", queued_s: float) -> "StreamUsage": ...


class TowerParts(Protocol):
    config: TowerConfig
    store: BlobStore
    allow: LiveAllowList
    hardware: CachedProbe
    announcer: Announcer | None

    @property
    def identity(self) -> Any: ...  # an RNS.Identity (RNS ships no types)

    @property
    def destination(self) -> Any: ...  # an RNS.Destination

    @property
    def registry(self) -> ModelRegistry: ...

    @property
    def inference(self) -> UsageOf: ...

    @property
    def split(self) -> SplitServing: ...

    @property
    def shard(self) -> ShardLending: ...

    @property
    def facts(self) -> "ModelFactsReader": ...

    def remote_alias(self, alias: str | None, kind: str) -> str | None: ...

    def record_tokens_per_s(self, value: float) -> None: ...

    def link_closed(self, link: Any) -> None: ...  # an RNS.Link whose LinkSession ended

