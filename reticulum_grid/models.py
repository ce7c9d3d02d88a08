"""The models a tower can serve: every blob of kind "model" in its store.

Models named in the tower config are registered in place and loaded at
start; models that arrive later (pushed or pulled) are loaded into llama.cpp
on first use. Loading checks free memory (VRAM, or RAM on a CPU tower)
against the model's need (weights + KV cache, gguf_info.need_mib), unloading
idle models least recently used first, and refuses with
``insufficient_memory`` when it still does not fit.
"""

import logging
import threading
import time
from dataclasses import dataclass, field

from announce.caps import SHORT_ID_BYTES, ModelCap
from links.wire import Code, WireError
from reticulum_grid import gguf_info, hardware
from reticulum_grid.admission import ModelQueue
from reticulum_grid.config import ModelConfig
from reticulum_grid.llama_backend import Generation, LlamaBackend, Sampling

log = logging.getLogger("rngrid.models")

MIB = 1 << 20


@dataclass
class ModelSlot:
    """One servable model: its blob, admission queue and (once loaded) backend."""
    blob_id: bytes
    path: str
    size: int
    settings: ModelConfig
    queue: ModelQueue
    backend: LlamaBackend = None
    need_mib: int = None
    last_used: float = 0.0
    load_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def loaded(self):
        return self.backend is not None

    @property
    def busy(self):
        return self.queue.running or self.queue.waiting


class ModelRegistry:
    def __init__(self, store, configs, queue_depth=4, on_tokens_per_s=None):
        self.store = store
        self.queue_depth = queue_depth
        self.on_tokens_per_s = on_tokens_per_s
        self._settings = {}
        self._slots = {}
        self._lock = threading.Lock()
        self._index_mtime = None
        for cfg in configs:
            self._settings[store.add_file(cfg.path, alias=cfg.alias, kind="model").blob_id] = cfg

    def load_configured(self):
        for blob_id in list(self._settings):
            self.backend(self.slot(blob_id))

    def aliases(self):
        """{alias: blob_id} of every model blob in the store."""
        self._refresh()
        return {alias: info.blob_id for info in self.store.list() if info.kind == "model" for alias in info.aliases}

    def _refresh(self):
        mtime = self.store.index_mtime()
        if mtime != self._index_mtime:
            self._index_mtime = mtime
            self.store.reload()

    def caps_models(self):
        """Every alias of every model blob (two aliases of one blob: two entries)."""
        return tuple(ModelCap(alias, blob_id[:SHORT_ID_BYTES], bool(self._slots.get(blob_id) and
                                                                    self._slots[blob_id].loaded))
                     for alias, blob_id in sorted(self.aliases().items()))

    def need_mib(self, slot):
        """Memory the slot's model needs loaded (MiB; gguf_info.need_mib), cached."""
        if slot.need_mib is None:
            slot.need_mib = gguf_info.need_mib(slot.path, slot.settings.n_ctx, slot.size)
        return slot.need_mib

    def slots(self):
        return list(self._slots.values())

    def find(self, name):
        """The ModelSlot for an alias or blob id prefix (>= 8 hex). Raises WireError(unknown_model)."""
        aliases = self.aliases()
        blob_id = aliases.get(name)
        if blob_id is None and len(name) >= 8:
            matches = {b for b in aliases.values() if b.hex().startswith(name.lower())}
            blob_id = matches.pop() if len(matches) == 1 else None
        if blob_id is None:
            raise WireError(Code.UNKNOWN_MODEL, f"model {name!r} is not on this tower; it has: "
                                                f"{', '.join(sorted(aliases)) or 'none'}")
        return self.slot(blob_id)

    def slot(self, blob_id):
        with self._lock:
            slot = self._slots.get(blob_id)
            if slot is None:
                info = self.store.info(blob_id)
                settings = self._settings.get(blob_id) or ModelConfig(info.hex, str(info.path))
                slot = self._slots[blob_id] = ModelSlot(blob_id, str(info.path), info.size, settings,
                                                        ModelQueue(self.queue_depth))
            return slot

    def backend(self, slot):
        """The slot's LlamaBackend, loading it first if needed (seconds for big
        models: call from a worker thread). Raises WireError(insufficient_memory)."""
        with slot.load_lock:
            slot.last_used = time.monotonic()
            if slot.backend is None:
                self._make_room(slot)
                s = slot.settings
                slot.backend = LlamaBackend(slot.path, n_ctx=s.n_ctx, n_threads=s.threads or None,
                                            n_gpu_layers=s.n_gpu_layers)
                self._warm_up(slot.backend)
                log.info("loaded model %s (%d MiB)", slot.blob_id.hex()[:16], slot.size // MIB)
            return slot.backend

    def _make_room(self, slot):
        need = self.need_mib(slot)
        free = hardware.probe().memory_free_mib
        idle = sorted((s for s in self._slots.values() if s.loaded and not s.busy and s is not slot),
                      key=lambda s: s.last_used)
        while need > free and idle:
            victim = idle.pop(0)
            log.info("unloading idle model %s to make room", victim.blob_id.hex()[:16])
            victim.backend.close()
            victim.backend = None
            free = hardware.probe().memory_free_mib
        if need > free:
            raise WireError(Code.INSUFFICIENT_MEMORY, f"model needs ~{need} MiB, {free} MiB free on this tower")

    def _warm_up(self, backend):
        # A first tokens/s figure for caps; the first request skips cold caches.
        result = Generation()
        for _ in backend.generate(backend.tokenize_prompt(prompt="Hello"), Sampling(max_tokens=8, temperature=0.0),
                                  threading.Event(), result):
            pass
        if self.on_tokens_per_s:
            self.on_tokens_per_s(result.tokens_per_s)
