"""Caps codec: round trip, budget, and hostile input (unit tests, no network)."""

import random

import msgpack
import pytest

from announce import caps as c


def full_caps(n_models=3, name="tower-a"):
    return c.Caps(
        name=name,
        hardware=c.Hardware("cuda", "NVIDIA GeForce RTX 5090", 32607, 30000, 128000, 100000),
        models=tuple(c.ModelCap(f"model-{i}", bytes([i]) * 4, i % 2 == 0) for i in range(n_models)),
        adapters=(c.AdapterCap("sql-lora", b"\xaa\xbb\xcc\xdd"),),
        load=c.Load(streams=2, jobs=1, queue=3),
        tokens_per_s=42.5,
        heartbeat_s=900,
        at_ms=1_764_770_000_123,  # a stamp of today's size (stamp_ms)
    )


def test_round_trip():
    caps = full_caps()
    assert c.decode(c.encode(caps)) == caps


def test_worst_case_fits_budget_and_sets_more():
    longest = "x" * c.NAME_MAX_BYTES
    caps = c.Caps(name=longest,
                  hardware=c.Hardware("cuda", "D" * c.DEVICE_MAX_BYTES, c.MAX_MIB, c.MAX_MIB, c.MAX_MIB, c.MAX_MIB),
                  models=tuple(c.ModelCap("m" * 32, bytes([i]) * 4, True) for i in range(20)),
                  adapters=tuple(c.AdapterCap("a" * 32, bytes([i]) * 4) for i in range(20)),
                  load=c.Load(c.MAX_COUNT, c.MAX_COUNT, c.MAX_COUNT), tokens_per_s=99999.9, at_ms=c.MAX_STAMP_MS)
    data = c.encode(caps)
    print(f"worst-case caps: {len(data)} bytes (budget {c.CAPS_BUDGET})")
    assert len(data) <= c.CAPS_BUDGET
    decoded = c.decode(data)
    assert decoded.more and 0 < len(decoded.models) < 20 and not decoded.adapters


def test_typical_caps_size():
    data = c.encode(full_caps())
    print(f"typical caps (3 models, 1 adapter): {len(data)} bytes")
    assert len(data) < 200


def test_loaded_models_kept_before_disk_only():
    caps = c.Caps(name="t", models=tuple(c.ModelCap("m" * 32, bytes([i]) * 4, i >= 15) for i in range(20)))
    decoded = c.decode(c.encode(caps))
    assert decoded.more and all(m.loaded for m in decoded.models)


@pytest.mark.parametrize("mutate, reason", [
    (lambda m: m.update(v=c.SCHEMA_VERSION + 1), f"unsupported caps schema version {c.SCHEMA_VERSION + 1}"),
    (lambda m: m.pop("v"), "no integer schema version"),
    (lambda m: m.update(n=5), "name is int"),
    (lambda m: m.update(n=""), "name is empty"),
    (lambda m: m.update(n="x" * 33), "name longer"),
    (lambda m: m.update(n="bad\x00name"), "control characters"),
    (lambda m: m["hw"].__setitem__(0, "quantum"), "unknown backend"),
    (lambda m: m["hw"].__setitem__(2, -1), "vram total -1 outside"),
    (lambda m: m["hw"].__setitem__(3, 10 ** 9), "outside"),
    (lambda m: m["hw"].__setitem__(3, 40000), "free memory exceeds total"),
    (lambda m: m["hw"].pop(), "hardware has 6 items"),
    (lambda m: m["m"][0].__setitem__(1, b"abc"), "short blob id"),
    (lambda m: m["m"][0].__setitem__(0, "../etc"), "path separator"),
    (lambda m: m["m"][0].__setitem__(2, 7), "loaded flag 7 outside"),
    (lambda m: m.update(m="nope"), "models is str"),
    (lambda m: m["l"].__setitem__(0, True), "streams is bool"),
    (lambda m: m.update(t=-5), "tokens/s -5 outside"),
    (lambda m: m.update(more=1), "more is int"),
    (lambda m: m.update(hb=0), "heartbeat 0 outside"),
])
def test_rejects_bad_fields(mutate, reason):
    raw = msgpack.unpackb(c.encode(full_caps()), raw=False)
    mutate(raw)
    with pytest.raises(c.CapsError, match=reason):
        c.decode(msgpack.packb(raw, use_bin_type=True))


def test_rejects_non_map_oversize_and_garbage():
    with pytest.raises(c.CapsError, match="not a map"):
        c.decode(msgpack.packb([1, 2, 3]))
    with pytest.raises(c.CapsError, match="limit"):
        c.decode(b"\x80" * (c.DECODE_MAX_BYTES + 1))
    with pytest.raises(c.CapsError, match="malformed msgpack"):
        c.decode(b"\xc1")
    with pytest.raises(c.CapsError, match="not bytes"):
        c.decode("text")


def test_random_bytes_only_ever_raise_caps_error():
    rng = random.Random(1234)
    good = c.encode(full_caps())
    for i in range(3000):
        if i % 2:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        else:
            data = bytearray(good)
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            c.decode(bytes(data))
        except c.CapsError:
            pass


def test_material_change():
    a = full_caps()
    assert a.materially_differs(None)
    assert not a.materially_differs(a)
    busier = c.Caps(**{**a.__dict__, "load": c.Load(streams=9, jobs=1, queue=9), "tokens_per_s": 1.0})
    assert not busier.materially_differs(a), "live load alone is not announced"
    training = c.Caps(**{**a.__dict__, "load": c.Load(jobs=2)})
    assert training.materially_differs(a)
    hw = a.hardware
    moved = c.Caps(**{**a.__dict__, "hardware": c.Hardware(hw.backend, hw.device, hw.vram_total_mib,
                                                                  hw.vram_free_mib - 4000, hw.ram_total_mib, hw.ram_free_mib)})
    assert moved.materially_differs(a)
    small = c.Caps(**{**a.__dict__, "hardware": c.Hardware(hw.backend, hw.device, hw.vram_total_mib,
                                                                  hw.vram_free_mib - 1000, hw.ram_total_mib, hw.ram_free_mib)})
    assert not small.materially_differs(a)


# -- caps/full (announce/capsfull.py) ------------------------------------------
def full_reply():
    from announce.capsfull import BlobFacts, Caller, CapsFull, GpuInfo, ModelSummary, VoiceInfo
    model = BlobFacts("model-0", b"\x01" * 32, 1 << 30, "model", True, on_gpu=True, gpu_mib=900, slots=4,
                      slots_free=3, n_ctx=4096, need_mib=1200, n_layers=30, embedding=576, draft_bytes=98_362_432,
                      gguf=ModelSummary("llama", 134_515_008, "Q4_1", 8192, 576, 30, 0, "SmolLM2"))
    return CapsFull(caps=full_caps(), blobs=(model, BlobFacts("", b"\x02" * 32, 12, "dataset"),
                                             BlobFacts("reader", b"\x03" * 32, 5, "model", reading=True)),
                    gpus=(GpuInfo(index=0, name="NVIDIA GeForce RTX 5090", total_mib=32607, free_mib=30000),),
                    voice=(VoiceInfo("espeak-ng", "tts", "en", 310.5, True),
                           VoiceInfo("whisper", "stt", error="Boom:\nno")),
                    dataplane=True, you=Caller(identity="ab" * 16, roles=("infer", "sync")))


def wire(full):
    """What the other end unpacks (msgpack both ways, as over a Link)."""
    return msgpack.unpackb(msgpack.packb(full.to_map(), use_bin_type=True), raw=False)


def test_caps_full_round_trip():
    from announce.capsfull import CapsFull
    full = full_reply()
    decoded = CapsFull.from_map(wire(full))
    assert decoded == full and decoded.roles == {"infer", "sync"}
    assert decoded.blob("model-0").n_layers == 30 and decoded.blob("missing") is None
    assert decoded.blob("model-0").draft_bytes == 98_362_432 and decoded.blob("reader").draft_bytes is None
    assert decoded.holds("reader") and decoded.holds("0202") and not decoded.holds("0404")


def test_caps_full_ignores_fields_it_does_not_know():
    from announce.capsfull import CapsFull
    raw = wire(full_reply())
    raw["future"] = {"x": 1}
    raw["blobs"][0]["future"] = [1, 2]
    raw["gpus"][0]["future"] = "y"
    assert CapsFull.from_map(raw) == full_reply()
    bare = CapsFull.from_map({"caps": raw["caps"]})
    assert bare.blobs == () and bare.you is None and bare.roles == frozenset() and not bare.dataplane


@pytest.mark.parametrize("mutate, reason", [
    (lambda m: m.pop("caps"), "not bytes"),
    (lambda m: m.update(blobs="x"), "blobs is str"),
    (lambda m: m["blobs"][0].update(size=-1), "size -1 outside"),
    (lambda m: m["blobs"][0].update(draft_bytes="98 MB"), "draft_bytes is str"),
    (lambda m: m["blobs"][0].update(blob_id=b"short"), "blob id is 5 bytes"),
    (lambda m: m["blobs"][0].pop("kind"), "has no kind"),
    (lambda m: m["blobs"][0].update(loaded=1), "loaded is int"),
    (lambda m: m["blobs"][0].update(alias="../x"), "path separator"),
    (lambda m: m["blobs"][0]["gguf"].update(name=5), "name is int"),
    (lambda m: m["blobs"][1].update(gguf=[]), "gguf summary is list"),
    (lambda m: m["gpus"][0].pop("name"), "gpu has no name"),
    (lambda m: m["voice"][0].update(kind="sing"), "unknown voice kind"),
    (lambda m: m["voice"][0].update(realtime=float("nan")), "realtime is float, not a number"),
    (lambda m: m["you"].update(roles="infer"), "roles is str"),
    (lambda m: m.update(dataplane="yes"), "dataplane is str"),
])
def test_caps_full_rejects_bad_fields(mutate, reason):
    from announce.capsfull import CapsFull
    raw = wire(full_reply())
    mutate(raw)
    with pytest.raises(c.CapsError, match=reason):
        CapsFull.from_map(raw)


def test_caps_full_is_built_by_keyword_only():
    """A field added to CapsFull can never shift another one's value by position."""
    from announce.capsfull import Caller, CapsFull, GpuInfo
    full = full_reply()
    with pytest.raises(TypeError):
        CapsFull(full.caps, full.blobs)  # type: ignore[misc]
    with pytest.raises(TypeError):
        Caller("ab" * 16, ("infer",))  # type: ignore[misc]
    with pytest.raises(TypeError):
        GpuInfo(0, "gpu", 1, 1)  # type: ignore[misc]
