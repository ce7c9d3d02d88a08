"""The models a tower can serve: every blob of kind "model" in its store, each run by a llama-server.

Models named in the tower config are registered in place and loaded at
start; models that arrive later (pushed or pulled) are loaded on first use.
A loaded model is one runner (runner.py) with ``parallel`` slots of ``n_ctx``
tokens each. Loading checks free memory (VRAM, or RAM on a CPU tower) against
the model's need (weights + the KV cache of every slot + a draft model,
gguf_info.need_mib), unloading idle models least recently used first, and
refuses with ``insufficient_memory`` when it still does not fit.
``parallel = 0`` (the default) takes as many slots as fit, at most
MAX_AUTO_SLOTS.

After loading, where llama.cpp really put the model (its own buffer report in
the runner's log, ``placement.py``) and how much memory the GPUs show gone are
checked against the estimate: a model kept off the GPU makes the tower a CPU
tower in its caps (``truthful``), and a load that took more than estimated
corrects the estimate. On several GPUs a model goes whole onto the one with
the most free memory when it fits there, else across them in proportion to
their free memory (``tensor_split``).

LoRA adapters and embeddings are part of how a runner starts: a request for
an adapter the runner lacks (or for embeddings) restarts it between requests
with the adapter added (``queue.drain``), after which every request picks its
own adapter and scale.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from announce.caps import SHORT_ID_BYTES, Hardware, ModelCap
from links.wire import Code, WireError
from reticulum_grid.inference.admission import ModelQueue
from reticulum_grid.inference.generation import AdapterError, Generation, generate
from reticulum_grid.inference.placement import LoadError
from reticulum_grid.inference.request import InferenceRequest, Sampling
from reticulum_grid.inference.runner import Runner
from reticulum_grid.inference.runner_spec import RunnerSpec
from reticulum_grid.node import hardware
from reticulum_grid.node.hardware import Gpu
from reticulum_grid.node.config import ConfigError, ModelConfig, is_source_ref
from reticulum_grid.store import gguf_info, importing
from reticulum_grid.store.foreign import SourceError
from reticulum_grid.store.blobstore import BlobStore

log = logging.getLogger("rngrid.models")

MIB = 1 << 20
#: Slots a runner gets at most when ``parallel`` is 0 (as many as fit).
MAX_AUTO_SLOTS = 4
#: Seconds a request waits for a runner that died and is being restarted.
RESTART_WAIT_S = 60.0
#: RAM a GPU tower keeps for itself when a model takes the rest beside its VRAM (MiB).
PARTIAL_RAM_HEADROOM_MIB = 2048


@dataclass
class ModelSlot:
    """One servable model: its blob, admission queue and (once loaded) runner."""
    blob_id: bytes
    path: str
    size: int
    settings: ModelConfig
    queue: ModelQueue
    runner: Runner | None = None
    need_mib: int | None = None
    last_used: float = 0.0
    offloaded: bool | None = None  # after load: llama.cpp put most weights on a GPU
    vram_mib: int | None = None    # after load: GPU memory the load took, as the GPUs show it
    adapters: tuple[str, ...] = ()  # GGUF LoRA paths the runner was started with, in its id order
    embeddings: bool = False
    partial: bool = False   # after load: part of the model is in RAM (it did not fit in VRAM)
    load_lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def loaded(self) -> bool:
        return self.runner is not None

    @property
    def busy(self) -> int:
        return self.queue.running or self.queue.waiting


class ModelRegistry:
    def __init__(self, store: BlobStore, configs: Iterable[ModelConfig], queue_depth: int = 4,
                 on_tokens_per_s: Callable[[float], None] | None = None, log_dir: Path | None = None,
                 on_slots: Callable[[], None] | None = None) -> None:
        self.store = store
        self.queue_depth = queue_depth
        self.on_tokens_per_s = on_tokens_per_s
        self.on_slots = on_slots  # a model's free slots or room went from none to some or back (admission.ModelQueue)
        self.log_dir = log_dir
        self._settings: dict[bytes, ModelConfig] = {}
        self._slots: dict[bytes, ModelSlot] = {}
        self._lock = threading.Lock()
        self._index_mtime: int | None = None
        for cfg in configs:
            blob_id = _register(store, cfg)
            other = self._settings.setdefault(blob_id, cfg)
            if _knobs(other) != _knobs(cfg):  # one loaded copy per file: one set of settings
                raise ConfigError(f"models.{other.alias} and models.{cfg.alias} are the same file with different "
                                  "settings; a tower loads a file once, so give both the same n_ctx, n_gpu_layers, "
                                  "threads, parallel, draft and embeddings (or keep one alias)")

    def load_configured(self) -> None:
        """Load the config's models (but those with ``preload = false``); one
        that does not fit is logged and left for later, so the tower still
        serves the others."""
        for blob_id in list(self._settings):
            try:
                slot = self.slot(blob_id)  # WireError: its file is gone
                if slot.settings.preload:
                    self.runner(slot, embeddings=slot.settings.embeddings)
            except (WireError, LoadError) as e:
                log.error("model %s not loaded: %s", self._settings[blob_id].alias, getattr(e, "message", e))

    def aliases(self) -> dict[str, bytes]:
        """{alias: blob_id} of every model blob in the store."""
        self._refresh()
        return {alias: info.blob_id for info in self.store.list() if info.kind == "model" for alias in info.aliases}

    def _refresh(self) -> None:
        mtime = self.store.index_mtime()
        if mtime != self._index_mtime:
            self._index_mtime = mtime
            self.store.reload()

    def caps_models(self) -> tuple[ModelCap, ...]:
        """Every alias of every model blob (two aliases of one blob: two
        entries), loaded ones with their free slots and free queue places."""
        out = []
        for alias, blob_id in sorted(self.aliases().items()):
            slot = self._slots.get(blob_id)
            loaded = slot is not None and slot.loaded
            queue = slot.queue if slot is not None and loaded else None
            out.append(ModelCap(alias, blob_id[:SHORT_ID_BYTES], loaded, queue.free if queue else 0,
                                queue.room - queue.free if queue else 0))
        return tuple(out)

    def n_ctx(self, slot: ModelSlot) -> int:
        """The slot's context window per sequence (tokens): the config's, or the model's own for 0."""
        return slot.settings.n_ctx or gguf_info.context_length(slot.path)

    def need_mib(self, slot: ModelSlot, parallel: int | None = None) -> int:
        """Memory the slot's model needs loaded with ``parallel`` slots (MiB;
        weights, KV cache of every slot, a draft model), cached for the
        configured count."""
        if parallel is None and slot.need_mib is not None:
            return slot.need_mib
        sequences = parallel or max(1, slot.settings.parallel)
        need = gguf_info.need_mib(slot.path, self.n_ctx(slot) * sequences, slot.size)
        if slot.settings.draft:
            draft = self.find(slot.settings.draft)
            need += gguf_info.need_mib(draft.path, self.n_ctx(slot) * sequences, draft.size)
        if parallel is None:
            slot.need_mib = need
        return need

    def slots(self) -> list[ModelSlot]:
        return list(self._slots.values())

    def find(self, name: str) -> ModelSlot:
        """The ModelSlot for an alias or blob id prefix (>= 8 hex). Raises WireError(unknown_model)."""
        aliases = self.aliases()
        blob_id = aliases.get(name)
        if blob_id is None and len(name) >= 8:
            matches = {b for b in aliases.values() if b.hex().startswith(name.lower())}
            blob_id = matches.pop() if len(matches) == 1 else None
        if blob_id is None:
            broken = next((b for b in self.store.broken() if name in b.aliases and b.kind == "model"), None)
            if broken is not None:
                raise WireError(Code.CORRUPT, f"model {name!r} is not served: {broken.problem}")
            raise WireError(Code.UNKNOWN_MODEL, f"model {name!r} is not on this tower; it has: "
                                                f"{', '.join(sorted(aliases)) or 'none'}")
        return self.slot(blob_id)

    def slot(self, blob_id: bytes) -> ModelSlot:
        with self._lock:
            slot = self._slots.get(blob_id)
            if slot is None:
                info = self.store.info(blob_id)
                if info is None:  # gone from the store since it was listed
                    raise WireError(Code.UNKNOWN_MODEL, f"model {blob_id.hex()[:16]} is no longer on this tower")
                settings = self._settings.get(blob_id) or ModelConfig(info.hex, str(info.path))
                slot = self._slots[blob_id] = ModelSlot(blob_id, str(info.path), info.size, settings,
                                                        ModelQueue(self.queue_depth, max(1, settings.parallel),
                                                                   on_change=self._slots_changed))
            return slot

    def _slots_changed(self) -> None:
        if self.on_slots is not None:
            self.on_slots()

    # -- runners ----------------------------------------------------------
    def runner(self, slot: ModelSlot, adapter: str | None = None, embeddings: bool = False) -> Runner:
        """The slot's Runner, started (or restarted between requests, see the
        module doc) so that it has ``adapter`` (a GGUF path) and embeddings
        if asked. Seconds for big models: call from a worker thread. Raises
        WireError(insufficient_memory), AdapterError, LoadError."""
        with slot.load_lock:
            slot.last_used = time.monotonic()
            self.verify(slot)
            if slot.runner is not None and not slot.runner.alive and not slot.runner.wait_up(RESTART_WAIT_S):
                raise WireError(Code.RUNNER_LOST, f"model {slot.settings.alias}'s engine is restarting: "
                                f"{slot.runner.last_error() or 'see the tower log'}", retry_after=RESTART_WAIT_S)
            missing = adapter is not None and adapter not in slot.adapters
            if slot.runner is not None and not missing and (slot.embeddings or not embeddings):
                return slot.runner
            adapters = slot.adapters + ((adapter,) if adapter is not None and missing else ())
            embeddings = embeddings or slot.embeddings
            if slot.runner is not None:
                log.info("model %s: restarting its runner for %s", slot.settings.alias,
                         "an adapter" if missing else "embeddings")
                with slot.queue.drain():
                    self._unload(slot)
            try:
                self._load(slot, adapters, embeddings)
            except LoadError as e:
                if not missing:
                    raise
                log.warning("model %s: llama.cpp cannot apply adapter %s: %s", slot.settings.alias, adapter, e)
                self._load(slot, adapters[:-1], embeddings)
                raise AdapterError(f"llama.cpp cannot apply the adapter at {adapter} to this model") from None
            assert slot.runner is not None  # _load set it
            return slot.runner

    def verify(self, slot: ModelSlot) -> None:
        """Serve nothing from a model file another program changed or deleted
        (a file registered in place, store.verify; it may hash the file again:
        call it off a request handler's thread): its runner stops and the
        caller gets the store's WireError(corrupt)."""
        try:
            self.store.verify(slot.blob_id)
        except WireError as e:
            names = next((b.aliases for b in self.store.broken() if b.blob_id == slot.blob_id), None)
            log.error("model %s: %s", ", ".join(names or [slot.settings.alias]), e.message)
            self._unload(slot)
            raise

    def _load(self, slot: ModelSlot, adapters: Sequence[str], embeddings: bool) -> None:
        hw, gpus, partial = self._make_room(slot)
        s = slot.settings
        parallel = s.parallel or (1 if partial else self._auto_parallel(slot, hw, gpus))
        split = tensor_split(gpus, self.need_mib(slot, parallel)) if s.n_gpu_layers and not partial else None
        draft = self.find(s.draft).path if s.draft else ""
        spec = RunnerSpec(slot.path, n_ctx=self.n_ctx(slot), parallel=parallel, n_gpu_layers=s.n_gpu_layers,
                          threads=s.threads, tensor_split=tuple(split or ()), adapters=tuple(adapters), draft=draft,
                          embeddings=embeddings, pooling="" if gguf_info.pooling(slot.path) else "mean", fit=partial)
        name = s.alias if s.alias != slot.blob_id.hex() else slot.blob_id.hex()[:16]
        assert self.log_dir is not None, "a registry that loads models needs a log_dir"
        try:
            runner = Runner(spec, self.log_dir / f"runner-{slot.blob_id.hex()[:16]}.log", name=name).start()
        except LoadError as e:
            if e.out_of_memory:
                raise WireError(Code.INSUFFICIENT_MEMORY, f"llama.cpp ran out of memory loading the model "
                                f"(~{self.need_mib(slot, parallel)} MiB estimated): {e}") from None
            raise
        slot.runner, slot.adapters, slot.embeddings = runner, tuple(adapters), embeddings
        slot.queue.set_slots(parallel)
        slot.need_mib = self.need_mib(slot, parallel)
        slot.partial = partial
        self._check_placement(slot, runner, hw, gpus, split)
        self._warm_up(slot, runner)

    def _auto_parallel(self, slot: ModelSlot, hw: Hardware, gpus: Sequence[Gpu]) -> int:
        """As many slots as fit in free memory, 1..MAX_AUTO_SLOTS."""
        for parallel in range(MAX_AUTO_SLOTS, 1, -1):
            if need_on(self.need_mib(slot, parallel), gpus) <= hw.memory_free_mib:
                return parallel
        return 1

    def _unload(self, slot: ModelSlot) -> None:
        if slot.runner is not None:
            slot.runner.close()
        slot.runner, slot.offloaded, slot.vram_mib = None, None, None

    def close(self) -> None:
        for slot in self.slots():
            with slot.load_lock:
                self._unload(slot)

    def _check_placement(self, slot: ModelSlot, runner: Runner, hw: Hardware, before: Sequence[Gpu],
                         split: list[float] | None) -> None:
        """Where llama.cpp put the model and what the GPUs show, against the estimate."""
        placement, name = runner.placement, slot.blob_id.hex()[:16]
        assert placement is not None and slot.need_mib is not None  # both set by a start
        slot.offloaded = placement.offloaded or (slot.partial and placement.mib(True, "model") > 0)
        if hw.backend != "cpu" and slot.settings.n_gpu_layers and not slot.offloaded:
            log.warning("model %s: llama.cpp kept its weights in host memory (%d MiB on GPUs, %d MiB on the CPU) "
                        "although n_gpu_layers is %d; this tower announces backend cpu", name,
                        placement.mib(True, "model"), placement.mib(False, "model"), slot.settings.n_gpu_layers)
        after = hardware.snapshot()[1] if before else ()
        if before and len(after) == len(before):
            slot.vram_mib = max(0, sum(g.free_mib for g in before) - sum(g.free_mib for g in after))
            if slot.vram_mib > slot.need_mib:
                log.warning("model %s took %d MiB of GPU memory, more than the %d MiB estimated; admission now "
                            "uses the measured figure", name, slot.vram_mib, slot.need_mib)
                slot.need_mib = slot.vram_mib
        log.info("loaded model %s (%d MiB file, %d slot(s) of %d tokens): %d MiB on GPUs%s, %d MiB in host memory "
                 "by llama.cpp's report; GPUs show %s MiB taken, %d MiB estimated", name, slot.size // MIB,
                 runner.spec.parallel, runner.spec.n_ctx, placement.mib(True),
                 f" (tensor_split {[round(x, 2) for x in split]})" if split else "", placement.mib(False),
                 slot.vram_mib if slot.vram_mib is not None else "-", slot.need_mib)

    @staticmethod
    def placement_info(slot: ModelSlot) -> dict[str, Any]:
        """For caps/full: where a loaded model sits and its slots ({} when not loaded). MiB."""
        runner = slot.runner
        if runner is None or runner.placement is None:
            return {}
        p = runner.placement
        return {"on_gpu": bool(slot.offloaded), "gpu_mib": p.mib(True), "host_mib": p.mib(False),
                "gpu_model_mib": p.mib(True, "model"), "host_model_mib": p.mib(False, "model"),
                "vram_mib": slot.vram_mib, "slots": runner.spec.parallel, "slots_free": slot.queue.free,
                "n_ctx": runner.spec.n_ctx}

    def truthful(self, hw: Hardware) -> Hardware:
        """``hw`` as the caps may announce it: a GPU tower with a loaded model
        that llama.cpp kept off the GPU serves from the CPU, so it says cpu
        and offers its RAM."""
        if hw.backend == "cpu" or all(s.offloaded is not False for s in list(self._slots.values()) if s.loaded):
            return hw
        return Hardware("cpu", hardware.cpu_label(), 0, 0, hw.ram_total_mib, hw.ram_free_mib)

    def _make_room(self, slot: ModelSlot) -> tuple[Hardware, tuple[Gpu, ...], bool]:
        """Unload idle models until ``slot``'s model fits: in VRAM (or RAM on a
        CPU tower), else in VRAM and RAM together (``partial``: llama.cpp then
        puts the layers that fit on the GPU and keeps the rest in RAM, its
        ``--fit``; not when the config names n_gpu_layers). Returns the
        (Hardware, GPUs, partial) reading it fits in; raises
        WireError(insufficient_memory)."""
        hw, gpus = hardware.snapshot()
        idle = sorted((s for s in self._slots.values() if s.loaded and not s.busy and s is not slot),
                      key=lambda s: s.last_used)
        base = self.need_mib(slot, max(1, slot.settings.parallel))

        def room() -> int:
            extra = hw.ram_free_mib - PARTIAL_RAM_HEADROOM_MIB if gpus and slot.settings.n_gpu_layers == -1 else 0
            return hw.memory_free_mib + max(0, extra)

        while (need := need_on(base, gpus)) > room() and idle:
            victim = idle.pop(0)
            log.info("unloading idle model %s to make room", victim.blob_id.hex()[:16])
            self._unload(victim)
            hw, gpus = hardware.snapshot()
        if need > room():
            where = f"{len(gpus)} GPU(s) ({hw.device}) and RAM" if gpus else "RAM"
            raise WireError(Code.INSUFFICIENT_MEMORY, f"model {slot.settings.alias} needs ~{need} MiB (weights + KV "
                            f"cache for {self.n_ctx(slot)} tokens), {room()} MiB free in this tower's {where}")
        return hw, gpus, need > hw.memory_free_mib

    def _warm_up(self, slot: ModelSlot, runner: Runner) -> None:
        # A first tokens/s figure for caps.
        result = Generation()
        request = InferenceRequest("", "Hello", None, Sampling(max_tokens=8, temperature=0.0), 0)
        try:
            for _ in generate(runner, request, threading.Event(), result):
                pass
        except Exception as e:  # a model that cannot say Hello still loaded
            log.warning("model %s: warm-up failed: %s", slot.settings.alias, e)
        if self.on_tokens_per_s and result.tokens_per_s:
            self.on_tokens_per_s(result.tokens_per_s)


def need_on(need_mib: int, gpus: Sequence[Gpu]) -> int:
    """Memory (MiB) a model needing ``need_mib`` takes on ``gpus``: split over
    several, each GPU it spans carries its own compute buffers."""
    if len(gpus) < 2 or need_mib <= max(g.free_mib for g in gpus):
        return need_mib
    return need_mib + gguf_info.RUNTIME_OVERHEAD_MIB * (len(gpus) - 1)


def tensor_split(gpus: Sequence[Gpu], need_mib: int) -> list[float] | None:
    """Each GPU's share of a model needing ``need_mib`` MiB, in llama.cpp's
    device order; None for fewer than two GPUs. The whole model goes on the
    GPU with the most free memory when it fits there (no traffic between GPUs
    per token), else the shares follow free memory."""
    if len(gpus) < 2:
        return None
    best = max(gpus, key=lambda g: g.free_mib)
    if need_mib <= best.free_mib:
        return [1.0 if g is best else 0.0 for g in gpus]
    total = sum(g.free_mib for g in gpus) or 1
    return [g.free_mib / total for g in gpus]


def _register(store: BlobStore, cfg: ModelConfig) -> bytes:
    """Register a config's model in place: its file, or the GGUF a source
    name (``ollama:...``, ``hf:...``, ``lmstudio:...``) stands for now.
    Returns its blob id. Raises ConfigError, WireError."""
    if not is_source_ref(cfg.path):
        return store.add_file(cfg.path, alias=cfg.alias, kind="model").blob_id
    try:
        return importing.register_source(store, cfg.path, cfg.alias).blob_id
    except SourceError as e:
        raise ConfigError(f"models.{cfg.alias}: {e}") from None


def _knobs(cfg: ModelConfig) -> tuple[int, int, int, int, str, bool]:
    return cfg.n_ctx, cfg.n_gpu_layers, cfg.threads, cfg.parallel, cfg.draft, cfg.embeddings
