"""``caps/full``: what a tower tells a Link that asks, beyond its announce. One typed reply.

The tower builds a ``CapsFull`` and sends ``to_map()``; every client reader
decodes it once with ``CapsFull.from_map``, which trusts nothing: a known
field of the wrong type or out of range raises CapsError with the reason,
and keys it does not know are ignored (as Petals' ``ServerInfo.from_tuple``),
so a field added here reaches new clients while old ones keep working.

Wire format (msgpack map; a row leaves out fields at their defaults)::

    {"caps": bytes,                  # the tower's caps in full (caps.py, no announce budget)
     "blobs": [{"alias": str,        # one row per alias ("" for a blob without one); models and
                "blob_id": 32 bytes, #   adapters to anyone, datasets and files only to identities
                "size": bytes,       #   on the tower's allow-list
                "kind": "model" | "adapter" | "peft" | "dataset" | "file",
                "loaded": bool,
                # a loaded model: where it sits (MiB), its slots and their context (tokens)
                "on_gpu", "gpu_mib", "host_mib", "gpu_model_mib", "host_model_mib",
                "vram_mib" (the load as the GPUs show it), "slots", "slots_free", "n_ctx",
                # a model's GGUF facts, read in the background (inference/facts.py)
                "need_mib", "n_layers", "embedding" (width), "expert_bytes" (an MoE model's expert
                tensors, absent for a dense one), "read_bytes" (weights one decoded token reads),
                "expert_read_bytes" (of which experts'), "reading": true while still to come,
                "draft_bytes",       # the draft model its split runs beside it (bytes; absent: none)
                "gguf": {"architecture", "parameters", "quantization", "context_length",
                         "embedding_length", "block_count", "pooling", "name"}}, ...],
     "gpus": [{"index", "name", "total_mib", "free_mib"}, ...],   # each GPU ([] on a CPU tower)
     "voice": [{"alias", "kind", "language", "realtime", "ready", "error"}, ...],  # every engine
     "dataplane": bool,              # a data-plane address is offered (never the address itself)
     "you": {"identity": hex, "roles": [str, ...]}}  # the asking identity (absent: unidentified)
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from announce import caps as capscodec
from announce.caps import ALIAS_MAX_BYTES, MAX_COUNT, MAX_GPUS, MAX_MIB, MAX_REALTIME, VOICE_KINDS, Caps, alias_field
from announce.fields import (
    CapsError,
    bool_field,
    int_field,
    list_field,
    map_field,
    number_field,
    text_field,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

BLOB_ID_BYTES = 32
#: Most rows a reply may carry (a tower with this many blobs is not a real one).
MAX_BLOBS = 100_000
MAX_BYTES = 1 << 50
MAX_TOKENS = 1 << 24
MAX_LAYERS = 100_000
#: Longest free text kept: a model's name, a voice engine's error.
TEXT_MAX_BYTES = 1024
MAX_ROLES = 16

Check = Callable[[object, str], object]


def _int(hi: int) -> Check:
    return lambda value, what: int_field(value, what, 0, hi)


def _text(max_bytes: int, **options: bool) -> Check:
    return lambda value, what: text_field(value, what, max_bytes, **options)


def _read(raw: object, schema: dict[str, Check], what: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The checked values of ``raw``'s known keys (None and absent read as the
    field's default); raises CapsError for a missing ``required`` key or a bad value.
    Each value has the type its field's check returns, which the schema map
    cannot tell a type checker: hence Any."""
    raw = map_field(raw, what)
    missing = [key for key in required if raw.get(key) is None]
    if missing:
        raise CapsError(f"{what} has no {', '.join(missing)}")
    return {key: check(raw[key], f"{what} {key}") for key, check in schema.items() if raw.get(key) is not None}


def _packed(obj: "DataclassInstance", always: tuple[str, ...] = ()) -> dict[str, object]:
    """A dataclass as a wire map: the ``always`` fields, and the others that differ from their default."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)
            if f.name in always or getattr(obj, f.name) != f.default}


@dataclass(frozen=True)
class ModelSummary:
    """What a model is, from its GGUF metadata (store/gguf_info.summary): for
    Ollama's ``/api/show`` and ``/api/tags``. None: the file does not say."""
    architecture: str | None = None
    parameters: int | None = None  # weights, summed over the tensors
    quantization: str | None = None  # llama.cpp's file type, e.g. "Q4_1"
    context_length: int | None = None  # tokens it was trained for
    embedding_length: int | None = None
    block_count: int | None = None
    pooling: int | None = None  # llama.cpp's enum; 0 none (an embedding model has one)
    name: str | None = None

    def to_map(self) -> dict[str, object]:
        return _packed(self)

    @classmethod
    def from_map(cls, raw: object) -> "ModelSummary":
        return cls(**_read(raw, _SUMMARY, "gguf summary"))


_SUMMARY: dict[str, Check] = {
    "architecture": _text(64), "parameters": _int(MAX_BYTES), "quantization": _text(32),
    "context_length": _int(MAX_TOKENS), "embedding_length": _int(1 << 20), "block_count": _int(MAX_LAYERS),
    "pooling": _int(16), "name": _text(TEXT_MAX_BYTES)}


@dataclass(frozen=True)
class BlobFacts:
    """One blob on a tower: sizes in bytes, memory in MiB. ``slots`` /
    ``slots_free``: streams the loaded model's runner serves at once and how
    many are free now; ``n_ctx``: tokens per slot. ``need_mib``,
    ``n_layers``, ``embedding``, ``expert_bytes``, ``read_bytes`` (what one
    decoded token reads of its weights), ``expert_read_bytes`` (of which the
    experts') and ``gguf`` come once the tower read the model's GGUF
    (``reading`` until then). ``draft_bytes``: the size of the
    draft model this tower runs beside the model when it coordinates a split
    of it (speculative decoding, tower/split.py draft_for), None for none."""
    alias: str
    blob_id: bytes
    size: int
    kind: str
    loaded: bool = False
    on_gpu: bool = False
    gpu_mib: int = 0
    host_mib: int = 0
    gpu_model_mib: int = 0
    host_model_mib: int = 0
    vram_mib: int | None = None
    slots: int = 0
    slots_free: int = 0
    n_ctx: int = 0
    need_mib: int | None = None
    n_layers: int | None = None
    embedding: int | None = None
    expert_bytes: int = 0
    read_bytes: int | None = None
    expert_read_bytes: int = 0
    reading: bool = False
    gguf: ModelSummary | None = None
    draft_bytes: int | None = None

    @property
    def hex(self) -> str:
        return self.blob_id.hex()

    @property
    def memory_bytes(self) -> int:
        """Bytes the loaded model takes on the GPUs and in host memory together."""
        return (self.gpu_mib + self.host_mib) << 20

    def to_map(self) -> dict[str, object]:
        out = _packed(self, always=("alias", "blob_id", "size", "kind", "loaded"))
        if self.gguf is not None:
            out["gguf"] = self.gguf.to_map()
        return out

    @classmethod
    def from_map(cls, raw: object) -> "BlobFacts":
        values = _read(raw, _BLOB, "blob", required=("alias", "blob_id", "size", "kind"))
        if len(values["blob_id"]) != BLOB_ID_BYTES:
            raise CapsError(f"blob id is {len(values['blob_id'])} bytes, not {BLOB_ID_BYTES}")
        return cls(**values)


def _bytes(value: object, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise CapsError(f"{what} is {type(value).__name__}, not bytes")
    return value


def _blob_alias(value: object, what: str) -> str:
    return alias_field(value, what) if value != "" else ""


_BLOB: dict[str, Check] = {
    "alias": _blob_alias, "blob_id": _bytes, "size": _int(MAX_BYTES), "kind": _text(16, allow_empty=False),
    "loaded": bool_field, "on_gpu": bool_field, "gpu_mib": _int(MAX_MIB), "host_mib": _int(MAX_MIB),
    "gpu_model_mib": _int(MAX_MIB), "host_model_mib": _int(MAX_MIB), "vram_mib": _int(MAX_MIB),
    "slots": _int(MAX_COUNT), "slots_free": _int(MAX_COUNT), "n_ctx": _int(MAX_TOKENS), "need_mib": _int(MAX_MIB),
    "n_layers": _int(MAX_LAYERS), "embedding": _int(1 << 20), "expert_bytes": _int(MAX_BYTES),
    "read_bytes": _int(MAX_BYTES), "expert_read_bytes": _int(MAX_BYTES), "reading": bool_field,
    "gguf": lambda value, what: ModelSummary.from_map(value), "draft_bytes": _int(MAX_BYTES)}


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    """One GPU of the tower (the caps carry their sum): memory in MiB."""
    index: int
    name: str
    total_mib: int
    free_mib: int

    @classmethod
    def from_map(cls, raw: object) -> "GpuInfo":
        return cls(**_read(raw, _GPU, "gpu", required=tuple(_GPU)))


_GPU: dict[str, Check] = {"index": _int(MAX_GPUS), "name": _text(256), "total_mib": _int(MAX_MIB),
                          "free_mib": _int(MAX_MIB)}


@dataclass(frozen=True)
class VoiceInfo:
    """A configured voice engine, ready or not (and why): ``kind`` "stt" or
    "tts", ``language`` "" for any, ``realtime`` x real time (measured at start)."""
    alias: str
    kind: str
    language: str = ""
    realtime: float = 0.0
    ready: bool = False
    error: str = ""

    @classmethod
    def from_map(cls, raw: object) -> "VoiceInfo":
        values = _read(raw, _VOICE, "voice engine", required=("alias", "kind"))
        if values["kind"] not in VOICE_KINDS:
            raise CapsError(f"unknown voice kind {values['kind']!r}")
        return cls(**values)


_VOICE: dict[str, Check] = {
    "alias": alias_field, "kind": _text(8), "language": _text(capscodec.LANGUAGE_MAX_BYTES),
    "realtime": lambda value, what: number_field(value, what, 0.0, MAX_REALTIME), "ready": bool_field,
    "error": _text(TEXT_MAX_BYTES, controls=True)}


@dataclass(frozen=True, kw_only=True)
class Caller:
    """The identity that asked (hex) and the roles the tower grants it."""
    identity: str
    roles: tuple[str, ...] = ()

    def to_map(self) -> dict[str, object]:
        return {"identity": self.identity, "roles": list(self.roles)}

    @classmethod
    def from_map(cls, raw: object) -> "Caller":
        values = _read(raw, _CALLER, "you", required=("identity",))
        return cls(identity=values["identity"], roles=tuple(values.get("roles", ())))


def _roles(value: object, what: str) -> tuple[str, ...]:
    return tuple(text_field(r, what, ALIAS_MAX_BYTES, allow_empty=False) for r in list_field(value, what, most=MAX_ROLES))


_CALLER: dict[str, Check] = {"identity": _text(64, allow_empty=False), "roles": _roles}


@dataclass(frozen=True, kw_only=True)
class CapsFull:
    """A tower's caps/full reply (see the module doc). Built by keyword only, so
    a field added here can never shift another one's value."""
    caps: Caps
    blobs: tuple[BlobFacts, ...] = ()
    gpus: tuple[GpuInfo, ...] = ()
    voice: tuple[VoiceInfo, ...] = ()
    dataplane: bool = False
    you: Caller | None = None

    @property
    def roles(self) -> frozenset[str]:
        """The roles the tower grants the asking identity (none when it was not identified)."""
        return frozenset(self.you.roles) if self.you is not None else frozenset()

    def blob(self, alias: str) -> BlobFacts | None:
        """The row of ``alias`` (exactly), or None."""
        return next((b for b in self.blobs if b.alias == alias), None)

    def holds(self, name: str) -> bool:
        """True when a row is ``name`` by alias or by blob id (hex prefix)."""
        return any(b.alias == name or b.hex.startswith(name.lower()) for b in self.blobs)

    def to_map(self) -> dict[str, object]:
        """The reply map a tower sends (its caps packed without the announce budget)."""
        out = {"caps": capscodec.encode(self.caps, budget=1 << 20), "blobs": [b.to_map() for b in self.blobs],
               "gpus": [_packed(g) for g in self.gpus],
               "voice": [_packed(v, always=tuple(_VOICE)) for v in self.voice], "dataplane": self.dataplane}
        if self.you is not None:
            out["you"] = self.you.to_map()
        return out

    @classmethod
    def from_map(cls, raw: object) -> "CapsFull":
        """Decode a caps/full reply map. Raises CapsError."""
        raw = map_field(raw, "caps/full reply")
        return cls(caps=capscodec.decode_full(raw.get("caps")),
                   blobs=tuple(BlobFacts.from_map(b) for b in _rows(raw, "blobs", MAX_BLOBS)),
                   gpus=tuple(GpuInfo.from_map(g) for g in _rows(raw, "gpus", MAX_GPUS)),
                   voice=tuple(VoiceInfo.from_map(v) for v in _rows(raw, "voice", MAX_COUNT)),
                   dataplane=bool_field(raw.get("dataplane", False), "dataplane"),
                   you=None if raw.get("you") is None else Caller.from_map(raw["you"]))


def _rows(raw: dict, key: str, most: int) -> list:
    value = raw.get(key)
    return [] if value is None else list_field(value, key, most=most)
