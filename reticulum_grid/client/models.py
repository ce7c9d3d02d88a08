"""What each tower says about the blobs it holds (its ``caps/full`` reply), decoded.

``caps/full``'s ``blobs`` list (tower/daemon.py) carries, per model, where it
sits and how many slots it has once loaded, and what the model is (read from
its GGUF in the background: absent for a moment after a tower starts). The
decoder trusts nothing: a row with a wrong type is dropped, and a field with
a wrong type reads as unknown. ``Grid.tower_models(entries)`` asks the towers.
"""

from dataclasses import dataclass, field

MIB = 1 << 20
#: Longest string kept from a tower's facts (names, architectures).
MAX_TEXT = 256


@dataclass(frozen=True)
class TowerModel:
    """One blob on one tower. Sizes in bytes, memory in MiB; ``slots`` /
    ``slots_free``: streams the loaded model's runner serves at once and how
    many of them are free now (0 when not loaded); ``n_ctx``: tokens per slot;
    ``facts``: store/gguf_info.summary of a model ({} until the tower read it)."""
    tower: str
    alias: str
    blob_id: bytes
    size: int
    kind: str
    loaded: bool = False
    on_gpu: bool = False
    gpu_mib: int = 0
    host_mib: int = 0
    slots: int = 0
    slots_free: int = 0
    n_ctx: int = 0
    facts: dict = field(default_factory=dict)

    @property
    def hex(self):
        return self.blob_id.hex()

    @property
    def memory_bytes(self):
        """Bytes the loaded model takes on the GPUs and in host memory together."""
        return (self.gpu_mib + self.host_mib) * MIB


def _count(value, limit=1 << 50):
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit else 0


def _text(value):
    return value if isinstance(value, str) and len(value) <= MAX_TEXT else ""


def _facts(raw):
    """The GGUF summary a tower sent, its known keys with the right types only."""
    if not isinstance(raw, dict):
        return {}
    out = {}
    for key in ("architecture", "quantization", "name"):
        if _text(raw.get(key)):
            out[key] = _text(raw.get(key))
    for key in ("parameters", "context_length", "embedding_length", "block_count", "pooling"):
        if _count(raw.get(key)):
            out[key] = _count(raw.get(key))
    return out


def decode_blobs(tower, reply):
    """[TowerModel] from one tower's caps/full ``reply`` (its models and adapters)."""
    rows = reply.get("blobs") if isinstance(reply, dict) else None
    out = []
    for row in rows if isinstance(rows, list) else ():
        if not isinstance(row, dict) or row.get("kind") not in ("model", "adapter") or not _text(row.get("alias")):
            continue
        blob_id = row.get("blob_id")
        if not isinstance(blob_id, bytes) or not 8 <= len(blob_id) <= 64:
            continue
        out.append(TowerModel(tower=tower, alias=_text(row["alias"]), blob_id=blob_id, size=_count(row.get("size")),
                              kind=row["kind"], loaded=row.get("loaded") is True, on_gpu=row.get("on_gpu") is True,
                              gpu_mib=_count(row.get("gpu_mib")), host_mib=_count(row.get("host_mib")),
                              slots=_count(row.get("slots"), 4096), slots_free=_count(row.get("slots_free"), 4096),
                              n_ctx=_count(row.get("n_ctx"), 1 << 24), facts=_facts(row.get("gguf"))))
    return out
