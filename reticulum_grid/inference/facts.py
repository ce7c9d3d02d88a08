"""A tower's model facts for caps/full, read from each GGUF in the background.

The gguf library takes seconds to read a model's metadata (every token of the
vocabulary), and an RNS request handler must not wait on it: it would hold up
every packet on the interface. ``known(slot)`` answers at once with what was
read so far and starts a read the first time a model is asked for; ``warm()``
reads every model the tower holds when it starts (a client planning a split
waits for a model's memory need and layer count). The facts themselves are
store/gguf_info's, read once per file.
"""

import logging
import threading

from reticulum_grid.inference.registry import ModelRegistry, ModelSlot
from reticulum_grid.store import gguf_info

log = logging.getLogger("rngrid.tower")


class ModelFactsReader:
    """Background reads of the models of ``registry``."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self._read: set[str] = set()  # paths whose facts are known
        self._reading: set[str] = set()  # paths sent to a background read
        self._unreadable: set[str] = set()  # paths whose read failed (blobs never change: not read again)
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Read every model the registry holds, in the background."""
        slots = []
        for blob_id in set(self.registry.aliases().values()):
            try:
                slots.append(self.registry.slot(blob_id))
            except Exception as e:  # a broken store entry is reported when the model is asked for
                log.warning("model %s: %s", blob_id.hex()[:16], e)
        with self._lock:
            self._reading.update(slot.path for slot in slots)
        threading.Thread(target=self._read_all, args=(slots,), name="rngrid-facts-warm", daemon=True).start()

    def known(self, slot: ModelSlot) -> dict[str, object]:
        """caps/full's facts of ``slot``'s model, each only when known without
        reading its file: ``need_mib`` (MiB), ``n_layers``, ``embedding``
        (width), ``expert_bytes`` (an MoE model's expert tensors), ``read_bytes`` and ``expert_read_bytes``
        (what a decoded token reads of them) and ``gguf`` (a ModelSummary); ``reading: True`` while a read
        is still to come (absent once it failed). Never blocks on the file."""
        facts: dict[str, object] = {} if slot.need_mib is None else {"need_mib": slot.need_mib}
        if slot.path in self._read:
            read = gguf_info.facts(slot.path)  # kept by gguf_info: no second read
            return {**facts, "n_layers": read.blocks, "embedding": read.embedding, "gguf": gguf_info.summary(slot.path),
                    "read_bytes": read.read_bytes,
                    **({"expert_bytes": read.expert_bytes, "expert_read_bytes": read.expert_read_bytes}
                       if read.expert_bytes else {})}
        with self._lock:
            start = slot.path not in self._reading
            self._reading.add(slot.path)
        if start:
            threading.Thread(target=self._read_one, args=(slot,), name="rngrid-facts", daemon=True).start()
        return facts if slot.path in self._unreadable else {**facts, "reading": True}

    def settled(self) -> bool:
        """True once every model the registry holds was read (or failed to be):
        from then on gguf_info answers about any of them without reading a file."""
        done = self._read | self._unreadable
        for blob_id in set(self.registry.aliases().values()):
            try:
                if self.registry.slot(blob_id).path not in done:
                    return False
            except Exception:  # a broken store entry: reported when the model is asked for
                continue
        return True

    def _read_all(self, slots: list[ModelSlot]) -> None:
        for slot in slots:
            self._read_one(slot)

    def _read_one(self, slot: ModelSlot) -> None:
        try:
            gguf_info.facts(slot.path)
            self.registry.need_mib(slot)  # a draft model's file too
        except Exception as e:
            self._unreadable.add(slot.path)
            log.warning("cannot read model %s: %s", slot.path, e)
            return
        self._read.add(slot.path)
