"""Capability blob ("caps"): the msgpack map a tower carries as announce app_data.

Wire format, schema version 2 (msgpack map, short keys to fit one announce)::

    {"v": 2,                      # schema version (int)
     "n": "tower-a",              # tower name, UTF-8, <= 32 bytes
     "hb": 900,                   # heartbeat interval, seconds (entries expire after ~2.5x)
     "hw": [backend, device,      # "cuda" | "metal" | "cpu" | ...; device name <= 40 bytes
            vram_total, vram_free,  # MiB, summed over the GPUs (0 when the backend has no VRAM)
            ram_total, ram_free,    # MiB
            gpus],                  # GPUs llama.cpp uses (0 on a CPU tower); each one in caps/full
     "m": [[alias, short_id, loaded, free], ...],   # models: alias, first 4 bytes of blob id, 0/1,
                                  # slots free to start a stream at once (0 when not loaded)
     "qf": [queue_free, ...],     # per "m" entry, in its order: free places in the model's queue (a
                                  # request beyond its free slots waits there instead of hearing
                                  # "busy"); optional, absent when all are 0
     "a": [[alias, short_id], ...],           # LoRA adapters
     "l": [streams, jobs, queue],             # running inference streams, training jobs, queue depth
     "t": 425,                    # tokens/s estimate x10 (int)
     "sh": 8192,                  # MiB lent to split models (optional; absent: unknown)
     "vo": [[alias, kind, language, realtime, free], ...],  # voice engines (optional): kind "stt"
                                  # (speech to text) or "tts" (text to speech); language an ISO 639
                                  # code or voice name, "" for any; realtime: seconds of audio per
                                  # second of work x10 (int), measured at start; free: requests that
                                  # start at once
     "more": True,                # present when models/adapters were left out: ask caps/full
     "at": 1764770000123}         # when the tower took these caps: milliseconds on its clock
                                  # (stamp_ms; never goes back while it runs); optional

An announce can arrive after a caps/full reply taken later (a transport node
forwards it a second late): the tower table keeps the caps with the later
``at`` (announce/table.py), so a stale announce does not undo what a probe
read.

The announce limit it must fit is measured against the pinned RNS by
``announce.announcer.app_data_limit()``; ``encode()`` keeps the blob under ``CAPS_BUDGET``
by dropping adapters, disk-only models, voice engines and then loaded models,
and setting ``more``.

``decode()`` trusts nothing: oversized blobs, malformed msgpack, unknown schema
versions, wrong types and absurd values raise ``CapsError`` with the reason.

Version 2 (was 1): the same map, from towers whose caps/full is one typed reply
(capsfull.py) and on links/protocol.py's protocol 1
(a version on every request, ``shard/tunnel``), and aliases held to
announce/aliases.py's rule. Ends on version 1 cannot talk to these towers, so
they do not hear them either: each side's decoder drops the other's announces.
"""

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import msgpack

from announce.aliases import ALIAS_MAX_BYTES, alias_problem
from announce.fields import CapsError, bool_field, int_field, list_field, text_field

#: 2: caps/full became one typed reply (capsfull.py), a stream's usage one map
#: (links/usage.py), and the commands one table (links/commands.py); a peer
#: speaking 1 is refused by name.
SCHEMA_VERSION = 2
NAME_MAX_BYTES = 32
DEVICE_MAX_BYTES = 40
SHORT_ID_BYTES = 4
MAX_MIB = 1 << 24  # 16 TiB: anything above is not a real machine
MAX_GPUS = 64
MAX_COUNT = 100_000
MAX_TOKENS_PER_S = 1_000_000
#: Hard cap on what decode() will even look at (bytes). caps/full uses decode_full().
DECODE_MAX_BYTES = 512
#: Our own budget for announce app_data (bytes), well under the measured RNS limit
#: (317 bytes through a transport node on rns 0.9.4, see announcer.app_data_limit()).
CAPS_BUDGET = 256
BACKENDS = ("cpu", "cuda", "metal", "rocm", "vulkan", "sycl")
VOICE_KINDS = ("stt", "tts")
LANGUAGE_MAX_BYTES = 16
#: Most a voice engine's announced speed is believed (x real time; espeak-ng reaches a few hundred).
MAX_REALTIME = 100_000
#: The largest "at" stamp accepted (milliseconds; 2**53, a JSON-safe integer).
MAX_STAMP_MS = 1 << 53


@dataclass(frozen=True)
class ModelCap:
    alias: str
    short_id: bytes
    loaded: bool = False
    free: int = 0  # slots free now (a stream starts at once); 0 when not loaded
    queue_free: int = 0  # free places in its queue (a request waits there rather than hear "busy"); 0 when not loaded

    @property
    def room(self) -> int:
        """Requests the tower takes now without "busy": free slots plus free places in the queue."""
        return self.free + self.queue_free

    @property
    def short_hex(self) -> str:
        return self.short_id.hex()


@dataclass(frozen=True)
class AdapterCap:
    alias: str
    short_id: bytes

    @property
    def short_hex(self) -> str:
        return self.short_id.hex()


@dataclass(frozen=True)
class VoiceCap:
    """A voice engine: ``kind`` "stt" or "tts"; ``language`` "" for any;
    ``realtime``: seconds of audio per second of work (x real time, measured
    when the tower started); ``free``: requests it starts at once."""
    alias: str
    kind: str
    language: str = ""
    realtime: float = 0.0
    free: int = 0


@dataclass(frozen=True)
class Hardware:
    backend: str = "cpu"
    device: str = ""
    vram_total_mib: int = 0
    vram_free_mib: int = 0
    ram_total_mib: int = 0
    ram_free_mib: int = 0
    gpus: int = 0  # GPUs behind the VRAM figures (their sum); 0 on a CPU tower

    @property
    def memory_free_mib(self) -> int:
        """Free memory a model can be loaded into (MiB): VRAM, or RAM on a CPU-only tower."""
        return self.vram_free_mib if self.vram_total_mib > 0 else self.ram_free_mib

    @property
    def memory_total_mib(self) -> int:
        return self.vram_total_mib if self.vram_total_mib > 0 else self.ram_total_mib


@dataclass(frozen=True)
class Load:
    streams: int = 0
    jobs: int = 0
    queue: int = 0


@dataclass(frozen=True)
class Caps:
    name: str
    hardware: Hardware = field(default_factory=Hardware)
    models: tuple[ModelCap, ...] = ()
    adapters: tuple[AdapterCap, ...] = ()
    load: Load = field(default_factory=Load)
    tokens_per_s: float = 0.0
    heartbeat_s: int = 900
    lend_mib: int | None = None  # memory lent to split models (MiB); None: not announced
    voice: tuple[VoiceCap, ...] = ()
    more: bool = False
    version: int = SCHEMA_VERSION
    at_ms: int = 0  # when the tower took these caps (stamp_ms); 0: not stamped

    def model(self, alias: str) -> ModelCap | None:
        """The ModelCap for ``alias`` (or a blob id prefix of >= 8 hex), or None."""
        return _find(self.models, alias)

    def adapter(self, alias: str) -> AdapterCap | None:
        """The AdapterCap for ``alias`` (or a blob id prefix of >= 8 hex), or None."""
        return _find(self.adapters, alias)

    def voices(self, kind: str, alias: str | None = None, language: str | None = None) -> list[VoiceCap]:
        """The VoiceCaps of ``kind`` named ``alias`` (None: any) that speak
        ``language`` (None or "": any; an engine announcing "" speaks any)."""
        return [v for v in self.voice if v.kind == kind and (not alias or v.alias == alias)
                and (not language or not v.language or v.language.split("-")[0] == language.split("-")[0])]

    def materially_differs(self, other: "Caps | None", vram_fraction: float = 0.10) -> bool:
        """True when a re-announce is warranted: models or adapters changed, a
        loaded model's slots or queue places became all taken or one freed, a training job
        started or ended, or free memory moved by more than ``vram_fraction``
        of the total."""
        if other is None:
            return True
        if _material(self.models) != _material(other.models) or self.adapters != other.adapters:
            return True
        if _material_voice(self.voice) != _material_voice(other.voice):
            return True
        if self.load.jobs != other.load.jobs:
            return True
        total = max(self.hardware.memory_total_mib, 1)
        moved = abs(self.hardware.memory_free_mib - other.hardware.memory_free_mib)
        return moved > vram_fraction * total


def _material(models: Iterable[ModelCap]) -> list[tuple[str, bytes, bool, bool, bool]]:
    return [(m.alias, m.short_id, m.loaded, m.free > 0, m.room > 0) for m in models]


def _material_voice(voices: Iterable[VoiceCap]) -> list[tuple[str, str, str, bool, bool]]:
    return [(v.alias, v.kind, v.language, v.realtime > 0, v.free > 0) for v in voices]


#: An entry _find looks up by alias or short blob id.
_Named = TypeVar("_Named", ModelCap, AdapterCap)


def _find(items: Iterable[_Named], name: str) -> _Named | None:
    for item in items:
        if item.alias == name:
            return item
    if len(name) >= 2 * SHORT_ID_BYTES:
        try:
            prefix = bytes.fromhex(name[:2 * SHORT_ID_BYTES])
        except ValueError:
            return None
        for item in items:
            if item.short_id == prefix:
                return item
    return None


def _pack_map(caps: Caps, models: Sequence[ModelCap], adapters: Sequence[AdapterCap], more: bool,
              voice: Sequence[VoiceCap] | None = None) -> bytes:
    hw = caps.hardware
    blob: dict[str, Any] = {
        "v": caps.version,
        "n": caps.name,
        "hb": int(caps.heartbeat_s),
        "hw": [hw.backend, hw.device, int(hw.vram_total_mib), int(hw.vram_free_mib),
               int(hw.ram_total_mib), int(hw.ram_free_mib), int(hw.gpus)],
        "m": [[m.alias, m.short_id, int(m.loaded), int(m.free)] for m in models],
        "a": [[a.alias, a.short_id] for a in adapters],
        "l": [caps.load.streams, caps.load.jobs, caps.load.queue],
        "t": int(round(caps.tokens_per_s * 10)),
    }
    if any(m.queue_free for m in models):
        blob["qf"] = [int(m.queue_free) for m in models]
    if caps.lend_mib is not None:
        blob["sh"] = int(caps.lend_mib)
    voice = caps.voice if voice is None else voice
    if voice:
        blob["vo"] = [[v.alias, v.kind, v.language, int(round(v.realtime * 10)), int(v.free)] for v in voice]
    if more:
        blob["more"] = True
    if caps.at_ms:
        blob["at"] = int(caps.at_ms)
    return msgpack.packb(blob, use_bin_type=True)


def encode(caps: Caps, budget: int = CAPS_BUDGET) -> bytes:
    """Pack ``caps`` into at most ``budget`` bytes of msgpack.

    Models, adapters and voice engines that do not fit are left out
    (adapters first, then models not loaded, voice engines, loaded models,
    newest last) and ``more`` is set so clients fetch ``caps/full``. Raises
    CapsError if even the bare blob exceeds the budget.
    """
    data = _pack_map(caps, caps.models, caps.adapters, caps.more)
    models = sorted(caps.models, key=lambda m: not m.loaded)  # stable: disk-only models go first
    adapters, voice = list(caps.adapters), list(caps.voice)
    while len(data) > budget and (adapters or models or voice):
        if adapters:
            adapters.pop()
        elif models and not models[-1].loaded or not voice:
            models.pop()
        else:
            voice.pop()
        data = _pack_map(caps, models, adapters, True, voice)
    if len(data) > budget:
        raise CapsError(f"caps for {caps.name!r} need {len(data)} bytes, budget is {budget}")
    return data


def decode(data: object, max_bytes: int = DECODE_MAX_BYTES) -> Caps:
    """Parse and validate announce app_data. Returns Caps; raises CapsError."""
    if not isinstance(data, (bytes, bytearray)):
        raise CapsError(f"app_data is {type(data).__name__}, not bytes")
    if len(data) > max_bytes:
        raise CapsError(f"app_data is {len(data)} bytes, limit {max_bytes}")
    try:
        raw = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True,
                              max_array_len=4096, max_map_len=64)
    except Exception as e:
        raise CapsError(f"malformed msgpack: {e}") from None
    return from_map(raw)


def decode_full(data: object, max_bytes: int = 1 << 20) -> Caps:
    """Parse caps served by ``caps/full`` (no announce size limit; 1 MiB cap)."""
    return decode(data, max_bytes=max_bytes)


def from_map(raw: object) -> Caps:
    """Validate an already-unpacked caps map. Raises CapsError."""
    if not isinstance(raw, dict):
        raise CapsError(f"caps is {type(raw).__name__}, not a map")
    version = raw.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise CapsError("caps has no integer schema version")
    if version != SCHEMA_VERSION:
        raise CapsError(f"unsupported caps schema version {version}")
    return Caps(
        name=text_field(raw.get("n"), "name", NAME_MAX_BYTES, allow_empty=False),
        heartbeat_s=int_field(raw.get("hb"), "heartbeat", 1, 7 * 86400),
        hardware=_hardware(raw.get("hw")),
        models=_models(raw.get("m"), raw.get("qf")),
        adapters=tuple(_adapter(a) for a in list_field(raw.get("a", []), "adapters")),
        load=_load(raw.get("l")),
        tokens_per_s=int_field(raw.get("t", 0), "tokens/s", 0, MAX_TOKENS_PER_S * 10) / 10.0,
        lend_mib=None if raw.get("sh") is None else int_field(raw.get("sh"), "lent memory", 0, MAX_MIB),
        voice=tuple(_voice(v) for v in list_field(raw.get("vo", []), "voice engines")),
        more=bool_field(raw.get("more", False), "more"),
        at_ms=int_field(raw.get("at", 0), "stamp", 0, MAX_STAMP_MS),
    )


_STARTED = (time.time(), time.monotonic())


def stamp_ms() -> int:
    """Milliseconds on this process's caps clock: the wall clock when it
    started plus the monotonic time since, so a stamp never goes back while
    it runs (a wall clock set back by NTP does not reorder its caps)."""
    return int((_STARTED[0] + time.monotonic() - _STARTED[1]) * 1000)


def _hardware(value: object) -> Hardware:
    items = list_field(value, "hardware", exact=7)
    backend = text_field(items[0], "backend", 16, allow_empty=False)
    if backend not in BACKENDS:
        raise CapsError(f"unknown backend {backend!r}")
    vram_total, vram_free, ram_total, ram_free = (
        int_field(v, n, 0, MAX_MIB) for v, n in zip(items[2:6], ("vram total", "vram free", "ram total", "ram free"))
    )
    if vram_free > vram_total or ram_free > ram_total:
        raise CapsError("free memory exceeds total")
    return Hardware(backend, text_field(items[1], "device", DEVICE_MAX_BYTES), vram_total, vram_free, ram_total,
                    ram_free, int_field(items[6], "gpu count", 0, MAX_GPUS))


def _models(value: object, queue_free: object) -> tuple[ModelCap, ...]:
    """The "m" entries with their "qf" free queue places (0 when "qf" is absent)."""
    models = [_model(m) for m in list_field(value, "models")]
    if queue_free is None:
        return tuple(models)
    places = list_field(queue_free, "free queue places", exact=len(models))
    return tuple(replace(m, queue_free=int_field(q, "free queue places", 0, MAX_COUNT)) for m, q in zip(models, places))


def _model(value: object) -> ModelCap:
    alias, short_id, loaded, free = list_field(value, "model entry", exact=4)
    return ModelCap(alias_field(alias), _short_id(short_id), bool(int_field(loaded, "loaded flag", 0, 1)),
                    int_field(free, "free slots", 0, MAX_COUNT))


def _adapter(value: object) -> AdapterCap:
    alias, short_id = list_field(value, "adapter entry", exact=2)
    return AdapterCap(alias_field(alias), _short_id(short_id))


def _voice(value: object) -> VoiceCap:
    alias, kind, language, realtime, free = list_field(value, "voice entry", exact=5)
    kind = text_field(kind, "voice kind", 8)
    if kind not in VOICE_KINDS:
        raise CapsError(f"unknown voice kind {kind!r}")
    language = text_field(language, "language", LANGUAGE_MAX_BYTES)
    if not all(c.isalnum() or c in "-_+" for c in language):
        raise CapsError(f"language {language!r} is not a language or voice name")
    return VoiceCap(alias_field(alias), kind, language, int_field(realtime, "realtime", 0, MAX_REALTIME * 10) / 10.0,
                    int_field(free, "voice free", 0, MAX_COUNT))


def _load(value: object) -> Load:
    items = list_field(value, "load", exact=3)
    return Load(*(int_field(v, n, 0, MAX_COUNT) for v, n in zip(items, ("streams", "jobs", "queue"))))


def alias_field(value: object, what: str = "alias") -> str:
    """``value`` as an alias (announce/aliases.py's rule). Raises CapsError."""
    alias = text_field(value, what, ALIAS_MAX_BYTES, allow_empty=False)
    problem = alias_problem(alias)
    if problem:
        raise CapsError(problem)
    return alias


def _short_id(value: object) -> bytes:
    if not isinstance(value, bytes) or len(value) != SHORT_ID_BYTES:
        raise CapsError(f"short blob id must be {SHORT_ID_BYTES} bytes")
    return value
