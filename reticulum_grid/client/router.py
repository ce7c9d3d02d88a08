"""Routing: which tower runs a request. The whole score is here.

Candidates are live towers whose caps list the model. Each gets a sort key,
compared left to right (lower is better):

1. ``backed_off``: the tower failed recently (exponential backoff, see Health);
   it is tried only when nothing else is left.
2. ``training``: a tower running a training job serves inference only when
   no other tower can.
3. ``tier``: 0 the model is loaded, 1 it is on the tower's disk, 2 it must be
   synced there first (only towers holding nothing are tier 2 candidates,
   and only when no tower holds the model at all).
4. ``no_room``: for a model not loaded yet, free memory below the model's
   need (GGUF size + KV cache, gguf_info.need_mib): VRAM and RAM together on
   a GPU tower (llama.cpp keeps the layers that do not fit on the GPU in
   RAM), RAM on a CPU tower. Free VRAM is the sum over the tower's GPUs
   (llama.cpp splits a model over them), plus one set of compute buffers per
   extra GPU (``need_on_gpus``).
5. ``partial``: the model would not fit in VRAM alone (partly in RAM: slower).
6. ``lacks_adapter``: the requested LoRA adapter would have to be synced first.
7. ``cost``: an estimate of seconds per generated token for this request,
   (waiting + 1) / tokens_per_s, plus the measured RTT in seconds. A loaded
   model's runner batches its streams, so while it has free slots (caps)
   only its line waits; otherwise ``waiting`` is its streams + queue +
   ``pending``, the streams this client started there since it last read the
   tower's load and that are still running: a busy fast tower and an idle
   slow one compare fairly, and simultaneous requests do not all pick the same tower.
   ``tokens_per_s`` is what this client measured of the tower's streams:
   the tokens it counted itself (token ids it received, each with at least
   one byte of text; links/stream.py TokenEvent.counted, never the tower's
   own count) over its own clock's time from sending the request to the last
   token, kept in its home across processes (client/measured.py). A tower it
   never streamed from is taken at its word only as a prior, and at most
   KIND_MARGIN times the best rate measured here of a tower of the same
   backend and device, or, with none measured, what hardware of its kind
   does (``PRIOR_MAX_TOKENS_PER_S``): a tower that announces 100,000 tokens/s
   wins one request at most, in this process or any later one sharing its home.
8. ``-headroom``: free memory beyond the model's need (MiB), more is better.
9. ``hops``: fewer is better.
10. a random tie-breaker, so equal towers share the load.

A split plan (client/split.py, split/plan.py) takes the memory each tower
says it lends the same way: at its word until a plan fails to load on it for
want of memory, then at most half the part it could not hold
(HealthBook.believed_lend_mib), kept in the client's home like the rates.
"""

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from announce.caps import Caps, Hardware, ModelCap, VoiceCap
from announce.table import TowerEntry
from links.wire import Code, WireError
from reticulum_grid.client.measured import MeasuredRates, kind_of
from reticulum_grid.store.gguf_info import RUNTIME_OVERHEAD_MIB

#: Backoff after the n-th consecutive failure: min(2**n, MAX_BACKOFF_S) seconds.
MAX_BACKOFF_S = 120.0


#: Seconds a tower that has not answered yet (its probe still runs) ranks last.
SILENT_BACKOFF_S = 2.0
#: The most tokens/s an announce is believed for, per backend (a 135M model on
#: a fast GPU reaches a few thousand; on a CPU a few hundred).
PRIOR_MAX_TOKENS_PER_S = {"cpu": 1000.0}
PRIOR_MAX_GPU_TOKENS_PER_S = 10000.0
#: Weight of a new measurement in the measured tokens/s (an exponential average).
MEASURED_WEIGHT = 0.5
#: A claim is believed up to this many times the best rate measured of its kind
#: (the same device runs a smaller model faster; a claim above the measured is
#: how a tower never measured gets its first request).
KIND_MARGIN = 2.0


@dataclass
class Health:
    """What the client measured of one tower.

    ``state``: "" (not asked yet), "ok" (answered), "silent" (no answer within
    its bound: frozen, gone, or its path is lost), "failed" (refused or broke
    a request); ``error`` says why; ``lost`` counts silences in a row;
    ``tokens_per_s``: the rate its streams reached here, from the request's
    send (0: never measured); ``decode_tokens_per_s``: from their first token
    on (a decode rate, what split estimates read a tower's bandwidth from: a
    rate that counts the prompt's time says little of reading weights)."""
    rtt_s: float = 0.0
    tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    failures: int = 0
    backoff_until: float = 0.0
    pending: int = 0
    state: str = ""
    error: str = ""
    lost: int = 0

    def backed_off(self, now: float | None = None) -> bool:
        return (now or time.monotonic()) < self.backoff_until


HEALTHY = Health()


class HealthBook:
    """Health per destination hash. Measured rates go to ``rates`` too
    (client/measured.py; the Grid's keeps them in its home, so the next
    process starts from them), and come from it at creation."""

    def __init__(self, rates: MeasuredRates | None = None) -> None:
        self.rates = rates if rates is not None else MeasuredRates()
        self._health: dict[bytes, Health] = {
            key: Health(tokens_per_s=m.tokens_per_s) for key, m in self.rates.towers().items() if m.tokens_per_s}

    def get(self, destination_hash: bytes) -> Health:
        return self._health.get(destination_hash, HEALTHY)

    def failed(self, destination_hash: bytes, error: str = "", lost: bool = False) -> Health:
        """The tower refused or broke a request (``lost``: it did not answer at
        all, or could not be reached). Returns its Health."""
        h = self._health.setdefault(destination_hash, Health())
        h.failures += 1
        h.backoff_until = time.monotonic() + min(2.0 ** h.failures, MAX_BACKOFF_S)
        h.state, h.error = ("silent" if lost else "failed"), error
        h.lost = h.lost + 1 if lost else 0
        return h

    def silent(self, destination_hash: bytes) -> None:
        """No answer yet while others answered: rank it last for a moment."""
        h = self._health.setdefault(destination_hash, Health())
        h.state, h.error = "silent", "no answer yet"
        h.backoff_until = max(h.backoff_until, time.monotonic() + SILENT_BACKOFF_S)

    def succeeded(self, destination_hash: bytes) -> None:
        h = self._health.setdefault(destination_hash, Health())
        h.failures, h.backoff_until, h.lost, h.state, h.error = 0, 0.0, 0, "ok", ""

    def rtt(self, destination_hash: bytes, seconds: float) -> None:
        """The tower answered a ping after ``seconds`` (its RTT)."""
        h = self._health.setdefault(destination_hash, Health())
        if h.state == "silent":  # a late answer: it was only slow
            h.backoff_until = 0.0
        h.rtt_s = seconds if not h.rtt_s else 0.7 * h.rtt_s + 0.3 * seconds
        h.state, h.error, h.lost = "ok", "", 0
        h.pending = 0  # the tower's own load figures now include our streams

    def started(self, destination_hash: bytes) -> None:
        self._health.setdefault(destination_hash, Health()).pending += 1

    def ended(self, destination_hash: bytes) -> None:
        """A stream this client started there ended: it is no longer load to add."""
        h = self._health.setdefault(destination_hash, Health())
        h.pending = max(0, h.pending - 1)

    def measured(self, destination_hash: bytes, tokens_per_s: float, hardware: Hardware,
                 decode_tokens_per_s: float | None = None) -> None:
        """A stream from the tower reached ``tokens_per_s`` on this client's
        clock (``decode_tokens_per_s`` from its first token on, None when too
        few came after it); ``hardware``: what the tower announced (its kind)."""
        h = self._health.setdefault(destination_hash, Health())
        h.tokens_per_s = _averaged(h.tokens_per_s, tokens_per_s)
        if decode_tokens_per_s:
            h.decode_tokens_per_s = _averaged(h.decode_tokens_per_s, decode_tokens_per_s)
        self.rates.record(destination_hash, kind_of(hardware.backend, hardware.device), h.tokens_per_s)

    def believed_decode_tokens_per_s(self, destination_hash: bytes, caps: Caps) -> float:
        """The decode rate a tower's bandwidth is estimated from: measured here
        (bounded by claim_bound: a tower that held its tokens back and sent them
        at once would look boundless), else believed_tokens_per_s."""
        measured = self.get(destination_hash).decode_tokens_per_s
        if measured > 0:
            return min(measured, self.claim_bound(caps.hardware))
        return self.believed_tokens_per_s(destination_hash, caps)

    def believed_tokens_per_s(self, destination_hash: bytes, caps: Caps) -> float:
        """The tokens/s a tower is ranked by: measured here, else its announce
        bounded by claim_bound (see the module doc)."""
        measured = self.get(destination_hash).tokens_per_s
        return measured if measured > 0 else min(caps.tokens_per_s, self.claim_bound(caps.hardware))

    def believed_lend_mib(self, destination_hash: bytes, caps: Caps) -> int | None:
        """The memory (MiB) a tower is believed to lend to split models: what it
        announces, at most half the smallest split part that failed to load
        there for want of memory (client/split.py marks it; a part that loads
        clears marks up to its size). None: it lends nothing."""
        failed = self.rates.get(destination_hash).lend_failed_mib
        return caps.lend_mib if caps.lend_mib is None or not failed else min(caps.lend_mib, failed // 2)

    def heard(self, entries: Iterable[TowerEntry]) -> None:
        """Towers were ranked here: their kind and announced tokens/s are kept
        (MeasuredRates.heard), so a later process knows what to wait for."""
        self.rates.heard({e.destination_hash: (kind_of(e.caps.hardware.backend, e.caps.hardware.device),
                                               e.caps.tokens_per_s) for e in entries})

    def faster_unheard(self, candidates: Iterable[TowerEntry], heard: Iterable[bytes],
                       trusted: Callable[[bytes], bool]) -> set[bytes]:
        """Destination hashes of towers not among ``heard``, that ``trusted``
        accepts and that this client believes faster than every one of
        ``candidates``: measured faster, or never measured and last heard
        announcing more, bounded as an unheard claim is (claim_bound). Each
        would outrank the candidates if its announce came in time."""
        best = max((self.believed_tokens_per_s(e.destination_hash, e.caps) for e in candidates), default=0.0)
        known = set(heard)
        return {h for h, m in self.rates.towers().items()
                if h not in known and (m.tokens_per_s or min(m.announced, self._kind_bound(m.kind))) > best
                and trusted(h)}

    def claim_bound(self, hardware: Hardware) -> float:
        """The most tokens/s believed of a tower never measured, on ``hardware``."""
        return self._kind_bound(kind_of(hardware.backend, hardware.device))

    def _kind_bound(self, kind: str) -> float:
        best = self.rates.best_of_kind(kind)
        backend = kind.partition("/")[0]
        return KIND_MARGIN * best if best else PRIOR_MAX_TOKENS_PER_S.get(backend, PRIOR_MAX_GPU_TOKENS_PER_S)


def _averaged(old: float, new: float) -> float:
    """The exponential average of measured rates (MEASURED_WEIGHT), ``old`` 0: none yet."""
    return new if not old else (1 - MEASURED_WEIGHT) * old + MEASURED_WEIGHT * new


@dataclass(frozen=True)
class Choice:
    """A ranked candidate and the reasons for its place."""
    entry: TowerEntry
    key: tuple[Any, ...]

    @property
    def reasons(self) -> dict[str, Any]:
        backed_off, training, tier, no_room, partial, lacks_adapter, cost, headroom, hops, _ = self.key
        return {"tier": ("loaded", "on disk", "sync first")[tier], "backed_off": backed_off, "training": training,
                "no_room": no_room, "partial": partial, "lacks_adapter": lacks_adapter, "cost_s_per_token": cost,
                "headroom_mib": -headroom, "hops": hops}


def candidates(entries: Iterable[TowerEntry], model: str) -> list[TowerEntry]:
    return [e for e in entries if e.caps.model(model) is not None]


def rank(entries: Iterable[TowerEntry], model: str, adapter: str | None = None, health: HealthBook | None = None,
         need_mib: int = 0, syncable: bool = False) -> list[Choice]:
    """Choices, best first. ``need_mib``: the model's memory need (0 if unknown);
    ``syncable``: the model can be synced to towers that lack it."""
    return sorted((Choice(e, k) for e, k in _keys(entries, model, adapter, health, need_mib, syncable)),
                  key=lambda c: c.key)


def choose(entries: Iterable[TowerEntry], model: str, adapter: str | None = None, health: HealthBook | None = None,
           need_mib: int = 0, syncable: bool = False) -> TowerEntry:
    """The best tower for ``model`` (one pass, no sort). Raises WireError(no_tower)."""
    best = min(_keys(entries, model, adapter, health, need_mib, syncable), key=lambda pair: pair[1], default=None)
    if best is None:
        raise WireError(Code.NO_TOWER, f"no tower has model {model!r}")
    return best[0]


def _keys(entries: Iterable[TowerEntry], model: str, adapter: str | None, health: HealthBook | None, need_mib: int,
          syncable: bool) -> list[tuple[TowerEntry, tuple[Any, ...]]]:
    """(entry, key) for every candidate."""
    book = health or HealthBook()
    now = time.monotonic()
    keyed = []
    for entry in entries:
        caps = entry.caps
        cap = caps.model(model)
        if cap is None:
            continue
        keyed.append((entry, _key(entry, caps, cap, 0 if cap.loaded else 1, adapter, book, need_mib, now)))
    if keyed or not syncable:
        return keyed
    return [(e, _key(e, e.caps, None, 2, adapter, book, need_mib, now)) for e in entries]


def need_on_gpus(need_mib: int, gpus: int) -> int:
    """A model's need (MiB) on a tower with ``gpus`` GPUs, as the caps show
    them (a sum): split over several, each carries its own compute buffers."""
    return need_mib + RUNTIME_OVERHEAD_MIB * (gpus - 1) if need_mib and gpus > 1 else need_mib


def room_mib(hardware: Hardware) -> int:
    """Free memory a whole model may take on a tower (MiB): VRAM and RAM on a
    GPU tower (the layers beyond the VRAM stay in RAM), RAM on a CPU tower."""
    return hardware.memory_free_mib + (hardware.ram_free_mib if hardware.vram_total_mib else 0)


def _key(entry: TowerEntry, caps: Caps, cap: ModelCap | None, tier: int, adapter: str | None, book: HealthBook,
         need_mib: int, now: float) -> tuple[Any, ...]:
    free = caps.hardware.memory_free_mib
    need_mib = need_on_gpus(need_mib, caps.hardware.gpus)
    load = caps.load
    health = book.get(entry.destination_hash)
    speed = max(book.believed_tokens_per_s(entry.destination_hash, caps), 1.0)
    if cap is not None and cap.loaded and cap.free:  # a free slot: the runner batches a new stream in
        waiting = load.queue + max(0, health.pending - cap.free)
    else:
        waiting = load.streams + load.queue + health.pending
    cost = (waiting + 1) / speed + health.rtt_s
    return (now < health.backoff_until, load.jobs > 0, tier, tier > 0 and room_mib(caps.hardware) < need_mib,
            tier > 0 and free < need_mib, bool(adapter and caps.adapter(adapter) is None), round(cost, 3),
            need_mib - free, entry.hops, random.random())


# -- voice engines ---------------------------------------------------------------
#
# Candidates are live towers whose caps list a voice engine of the kind asked
# ("stt" or "tts"), named as asked (any when no name is given) and speaking
# the language asked (an engine announcing "" speaks any). Sort key, lower
# is better:
#
# 1. ``backed_off``, as above.
# 2. ``waits``: the engine has no free slot now (a request would queue).
# 3. ``cost``: seconds the request is expected to take there, (queue ahead +
#    1) x audio seconds / the engine's speed (x real time, measured by the
#    tower at its start; at most PRIOR_MAX_REALTIME is believed) + the RTT.
# 4. ``hops``, 5. a random tie-breaker.

#: The most an announced voice speed is believed (x real time): Whisper base
#: on a fast GPU reaches ~100x, espeak-ng ~500x on one core.
PRIOR_MAX_REALTIME = 1000.0


@dataclass(frozen=True)
class VoiceChoice:
    """A ranked voice candidate: its ``entry``, the engine's ``cap`` (VoiceCap) and the key."""
    entry: TowerEntry
    cap: VoiceCap
    key: tuple[Any, ...]

    @property
    def reasons(self) -> dict[str, Any]:
        backed_off, waits, cost, hops, _ = self.key
        return {"engine": self.cap.alias, "backed_off": backed_off, "waits": waits, "cost_s": cost, "hops": hops}


def rank_voice(entries: Iterable[TowerEntry], kind: str, alias: str | None = None, language: str | None = None,
               audio_s: float = 5.0, health: HealthBook | None = None) -> list[VoiceChoice]:
    """VoiceChoices for a request of ``kind`` ("stt"/"tts") on ``audio_s``
    seconds of audio (a guess for speech), best first."""
    book = health or HealthBook()
    now = time.monotonic()
    choices = []
    for entry in entries:
        h = book.get(entry.destination_hash)
        for cap in entry.caps.voices(kind, alias, language):
            speed = min(max(cap.realtime, 0.1), PRIOR_MAX_REALTIME)
            cost = (h.pending + (0 if cap.free else 1) + 1) * audio_s / speed + h.rtt_s
            choices.append(VoiceChoice(entry, cap, (now < h.backoff_until, cap.free == 0, round(cost, 3), entry.hops,
                                                    random.random())))
    return sorted(choices, key=lambda c: c.key)
