"""Voice pieces without a network: caps entries and their budget, the request contract and the
segment reader against hostile input, config tables, voice routing, the audio codecs, the bundled
model's pinned hash."""

import msgpack
import numpy as np
import pytest

from announce import caps as c
from links.wire import WireError
from reticulum_grid.client import router
from reticulum_grid.node import config
from reticulum_grid.voice import audio, models
from reticulum_grid.voice.request import SegmentReader, parse_speech, parse_transcribe, pack_segment
from reticulum_grid.voice.stt import Segment
from testbed.requirements import needs
from testbed.voice_support import wer

STT = c.VoiceCap("whisper-base", "stt", "", 4.2, 1)
TTS = c.VoiceCap("espeak-ng", "tts", "en", 399.0, 1)


def voice_caps(**kw):
    return c.Caps(name="v", models=(c.ModelCap("smol", b"\x01" * 4, True),), voice=(STT, TTS), **kw)


def test_voice_caps_round_trip_and_lookup():
    caps = voice_caps()
    decoded = c.decode(c.encode(caps))
    assert decoded == caps
    assert decoded.voices("stt") == [STT] and decoded.voices("tts", language="en-gb") == [TTS]
    assert decoded.voices("tts", language="de") == [] and decoded.voices("stt", language="de") == [STT]
    assert decoded.voices("stt", alias="other") == []


def test_voice_entries_trimmed_after_disk_models_before_loaded_ones():
    models = tuple(c.ModelCap("m" * 32, bytes([i]) * 4, i == 0) for i in range(8))
    voice = tuple(c.VoiceCap("v" * 32, "stt", "x" * 16, 99999.9, 7) for _ in range(6))
    data = c.encode(c.Caps(name="t" * 32, models=models, voice=voice))
    decoded = c.decode(data)
    assert len(data) <= c.CAPS_BUDGET and decoded.more
    assert [m.loaded for m in decoded.models] == [True], "disk-only models go before voice engines"
    assert decoded.voice, "voice engines stay while they fit"
    bare = c.encode(c.Caps(name="t" * 32, voice=voice[:2]))
    print(f"two longest voice entries: {len(bare)} bytes (budget {c.CAPS_BUDGET})")
    assert len(bare) <= c.CAPS_BUDGET and len(c.decode(bare).voice) == 2


def test_voice_change_is_material():
    assert voice_caps().materially_differs(c.Caps(name="v", models=voice_caps().models))
    busy = voice_caps()
    assert not busy.materially_differs(voice_caps())


@pytest.mark.parametrize("entry, reason", [
    (["a", "asr", "", 1, 1], "unknown voice kind"),
    (["a", "stt", "en us", 1, 1], "not a language"),
    (["a", "stt", "", -1, 1], "realtime -1 outside"),
    (["a", "stt", ""], "voice entry has 3 items"),
    (["../x", "stt", "", 1, 1], "path separator"),
    (["a", "stt", "e\x00", 1, 1], "control characters"),
])
def test_hostile_voice_entries_rejected(entry, reason):
    raw = msgpack.unpackb(c.encode(voice_caps()), raw=False)
    raw["vo"] = [entry]
    with pytest.raises(c.CapsError, match=reason):
        c.decode(msgpack.packb(raw, use_bin_type=True))


@pytest.mark.parametrize("request_map, reason", [
    ({"stream_id": 1}, "one of them"),
    ({"stream_id": 1, "audio": b"x", "blob_id": b"y" * 32, "manifest": b""}, "one of them"),
    ({"stream_id": 1, "blob_id": b"y" * 32}, "manifest"),
    ({"stream_id": 1, "audio": b"x", "colour": 1}, "unknown field"),
    ({"stream_id": 1, "audio": b"x", "language": "e n"}, "not a name"),
    ({"stream_id": 1, "audio": b"x", "offset_s": -1}, "outside"),
    ({"stream_id": 1, "audio": b"x" * (256 << 10 | 1)}, "length"),
])
def test_transcribe_requests_checked(request_map, reason):
    with pytest.raises(WireError, match=reason):
        parse_transcribe(request_map)


def test_speech_requests_checked():
    assert parse_speech({"stream_id": 2, "text": "hi"}).format == "pcm"
    for bad, reason in (({"text": "   "}, "nothing to say"), ({"text": "x" * 4097}, "length"),
                        ({"text": "hi", "format": "mp3"}, "format"), ({"text": "hi", "wpm": 5000}, "outside")):
        with pytest.raises(WireError, match=reason):
            parse_speech({"stream_id": 2, **bad})


def test_segment_reader_joins_split_segments_and_refuses_garbage():
    data = b"".join(pack_segment(Segment(i, i + 0.5, f"word {i}")) for i in range(3))
    reader, got = SegmentReader(), []
    for i in range(0, len(data), 5):  # cut anywhere, as a stream's chunks may be
        got += reader.feed(data[i:i + 5])
    assert [(s.start_s, s.text) for s in got] == [(0.0, "word 0"), (1.0, "word 1"), (2.0, "word 2")]
    for hostile in ({"s": 1, "e": 0, "t": "x"}, {"s": 0, "e": 1}, {"s": "0", "e": 1, "t": "x"}, [1, 2, 3],
                    {"s": 0, "e": 1, "t": "x", "more": 1}, {"s": True, "e": 1, "t": "x"}):
        with pytest.raises(WireError) as e:
            SegmentReader().feed(msgpack.packb(hostile))
        assert e.value.code == "bad_stream"


def test_voice_config_tables(tmp_path):
    path = tmp_path / "tower.toml"
    config.write_tower(path, "v", {}, voice={"whisper-base": {"kind": "stt", "threads": 2, "path": "m"},
                                             "espeak-ng": {"kind": "tts", "voice": "en-gb"}})
    voice = config.load_tower(path).voice
    assert [(v.alias, v.kind) for v in voice] == [("whisper-base", "stt"), ("espeak-ng", "tts")]
    assert voice[0].threads == 2 and voice[0].path == str(tmp_path / "m") and voice[1].voice == "en-gb"
    for table, reason in (({"kind": "asr"}, "kind must be"), ({"kind": "stt", "colour": 1}, "unknown key"),
                          ({"kind": "stt", "device": "tpu"}, "device"), ({"kind": "tts", "voice": "a b"}, "voice")):
        config.write_tower(path, "v", {}, voice={"x": table})
        with pytest.raises(config.ConfigError, match=reason):
            config.load_tower(path)


class EntryDouble:
    """A test double of a tower table entry (announce/table.py): a name, a destination hash, hops and caps."""

    def __init__(self, name, voice, hops=1):
        self.name, self.destination_hash, self.hops = name, name.encode().ljust(16, b"\0"), hops
        self.caps = c.Caps(name=name, voice=voice)


@pytest.mark.parametrize("towers, kind, language, best", [
    ([("slow", (c.VoiceCap("w", "stt", "", 2.0, 1),)), ("fast", (c.VoiceCap("w", "stt", "", 20.0, 1),))],
     "stt", None, "fast"),
    ([("busy", (c.VoiceCap("w", "stt", "", 20.0, 0),)), ("free", (c.VoiceCap("w", "stt", "", 2.0, 1),))],
     "stt", None, "free"),
    ([("german", (c.VoiceCap("e", "tts", "de", 400.0, 1),)), ("any", (c.VoiceCap("e", "tts", "", 100.0, 1),))],
     "tts", "en", "any"),
    ([("liar", (c.VoiceCap("w", "stt", "", 99999.0, 1),)), ("real", (c.VoiceCap("w", "stt", "", 999.0, 1),))],
     "stt", None, None),  # both capped at PRIOR_MAX_REALTIME: a tie broken at random
])
def test_voice_routing(towers, kind, language, best):
    entries = [EntryDouble(name, voice) for name, voice in towers]
    ranked = router.rank_voice(entries, kind, language=language, audio_s=10)
    if best is None:
        assert ranked[0].key[2] == ranked[1].key[2]
    else:
        assert ranked[0].entry.name == best
    assert router.rank_voice(entries, "stt" if kind == "tts" else "tts") == []


@needs("faster-whisper", "PyAV, faster-whisper's decoder, encodes and decodes the audio")
def test_codecs_round_trip_and_refuse():
    t = np.arange(3 * audio.STT_RATE) / audio.STT_RATE
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    for data in (audio.wav(audio.pcm16(tone), audio.STT_RATE), audio.opus(tone, bitrate=audio.OPUS_RADIO_BPS),
                 audio.convert(audio.pcm16(tone), audio.STT_RATE, "flac"),
                 audio.convert(audio.pcm16(tone), audio.STT_RATE, "mp3")):
        assert abs(len(audio.decode(data)) / audio.STT_RATE - 3.0) < 0.1
    small = audio.opus(tone, bitrate=audio.OPUS_RADIO_BPS)
    assert len(small) < 3 * audio.OPUS_RADIO_BPS / 8 * 1.3, "12 kbit/s Opus, plus Ogg's pages"
    assert audio.for_link(small, 5500) == (small, "original"), "already compressed: sent as it is"
    sent, kind = audio.for_link(audio.wav(audio.pcm16(tone), audio.STT_RATE), 5500)
    assert kind == "opus" and len(sent) < len(small) * 1.2
    with pytest.raises(audio.AudioError, match="longer than"):
        audio.decode(audio.wav(audio.pcm16(tone), audio.STT_RATE), max_s=1.0)
    with pytest.raises(audio.AudioError, match="decoded"):
        audio.decode(b"\x00" * 64)


@needs("whisper-base", "the model's two halves are joined and hashed")
def test_bundled_model_checked_against_its_pinned_hash(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "MODEL_SHA256", "0" * 64)
    with pytest.raises(models.ModelMissing, match="not the pinned"):
        models.install(tmp_path / "model")
    assert not list(tmp_path.iterdir()), "a model that does not match is not left behind"


def test_word_error_rate():
    assert wer("the quick brown fox", "The quick, brown fox!") == 0
    assert wer("the quick brown fox", "the quick fox") == 0.25
    assert wer("a b", "a x b y") == 1.0
