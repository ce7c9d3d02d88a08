"""Voice on real towers with real engines: espeak-ng speaks, faster-whisper (the bundled Whisper base)
transcribes, through the grid; the CLI; roles, busy, cancel, failover mid-transcript, a blob upload."""

import json
import time

import pytest

from announce import caps as capscodec
from links.wire import Code, WireError
from reticulum_grid.client import voice as client_voice
from reticulum_grid.node.allowlist import allow, revoke
from reticulum_grid.voice import models
from reticulum_grid.voice.audio import STT_RATE, decode
from reticulum_grid.voice.stt import SpeechToText, TranscriptInfo
from tests.conftest import rngrid
from testbed.requirements import needs
from testbed.voice_support import SENTENCE, TOWERS, VOICE, spoken, wait_voice, wer

pytestmark = [needs("espeak-ng", "the known sentence is spoken by espeak-ng"),
              needs("faster-whisper", "speech to text runs on faster-whisper")]

#: ~40 s of speech: two of Whisper's 30 s windows, so a transcript has segments before its end.
LONG = " ".join(TOWERS)


@pytest.fixture(scope="module")
def tower(hub):
    # queue_depth 0: a second request while one runs is "busy".
    t = hub.start_tower("voice-a", models={}, roles=("voice",), voice=VOICE, limits={"queue_depth": 0})
    wait_voice(hub, "voice-a")
    yield t
    hub.stop_towers([t])


@pytest.fixture(scope="module")
def long_audio():
    return spoken(LONG, wpm=170)


def _transcript(hub, data, **options):
    return hub.grid.transcribe(data, tower="voice-a", **options).transcript()


def test_caps_announce_voice_engines_within_budget(hub, tower):
    entry = wait_voice(hub, "voice-a")
    stt, tts = entry.caps.voices("stt")[0], entry.caps.voices("tts")[0]
    assert (stt.alias, stt.kind, tts.alias, tts.kind) == ("whisper-base", "stt", "espeak-ng", "tts")
    assert stt.realtime > 0.5 and tts.realtime > 5, "measured at start: x real time"
    assert len(capscodec.encode(entry.caps)) <= capscodec.CAPS_BUDGET
    full = hub.grid.connection(entry).request("caps/full", {})
    assert {v["alias"]: v["ready"] for v in full["voice"]} == {"whisper-base": True, "espeak-ng": True}


def test_espeak_sentence_transcribed_through_the_grid(hub, tower):
    data = spoken()
    stream = hub.grid.transcribe(data)  # routed: any speech-to-text tower
    items = list(stream)
    segments, end = items[:-1], items[-1]
    text = " ".join(s.text for s in segments)
    print(f"heard {text!r}; {end}")
    assert wer(SENTENCE, text) <= 0.2
    assert end.language == "en" and end.tower == "voice-a" and end.segments == len(segments) >= 1
    audio_s = len(decode(data)) / STT_RATE
    assert all(0 <= s.start_s <= s.end_s <= audio_s + 0.5 for s in segments)
    assert abs(end.audio_s - audio_s) < 0.1 and end.realtime > 0
    assert stream.sent_as == "opus" and stream.sent_bytes < len(data) / 5, "a WAV crosses the link as Opus"


def test_spoken_by_the_grid_and_heard_back(hub, tower):
    speech = hub.grid.speak(SENTENCE)
    assert speech.data[:4] == b"RIFF" and speech.end.sample_rate == 22050 and speech.received_as == "pcm"
    samples = decode(speech.data)
    assert abs(len(samples) / STT_RATE - speech.end.audio_s) < 0.1 and speech.end.audio_s > 2
    local = SpeechToText("local", models.install(), threads=1)
    info = TranscriptInfo()
    text = " ".join(s.text for s in local.transcribe(samples, info))
    print(f"the grid said, faster-whisper heard here: {text!r}")
    assert wer(SENTENCE, text) <= 0.2 and info.language == "en"


def test_cli_say_then_transcribe(hub, tower, tmp_path):
    wav_path, cli_home = tmp_path / "said.wav", tmp_path / "cli"
    allow(tower.config_path, _identity(cli_home), ["voice"])
    connect = ["--connect", tower.address]
    said = rngrid("say", SENTENCE, "-o", str(wav_path), "--json", *connect, home=cli_home, timeout=180)
    assert said.returncode == 0, said.stderr[-2000:]
    end = json.loads(said.stdout.strip().splitlines()[-1])["end"]
    assert end["tower"] == "voice-a" and end["format"] == "wav" and wav_path.read_bytes()[:4] == b"RIFF"
    heard = rngrid("transcribe", str(wav_path), "--json", *connect, home=cli_home, timeout=180)
    assert heard.returncode == 0, heard.stderr[-2000:]
    lines = [json.loads(line) for line in heard.stdout.strip().splitlines()]
    text = " ".join(line["segment"]["text"] for line in lines if "segment" in line)
    assert wer(SENTENCE, text) <= 0.2 and lines[-1]["end"]["language"] == "en"
    plain = rngrid("transcribe", str(wav_path), *connect, home=cli_home, timeout=180)
    assert plain.returncode == 0 and "-> " in plain.stdout and wer(SENTENCE, plain.stdout.split("]", 1)[1]) <= 0.2
    towers = rngrid("towers", "--json", "--wait", "10", *connect, home=cli_home)
    (row,) = [r for r in json.loads(towers.stdout) if r["name"] == "voice-a"]
    assert {(v["alias"], v["kind"]) for v in row["voice"]} == {("whisper-base", "stt"), ("espeak-ng", "tts")}
    table = rngrid("towers", "--wait", "10", *connect, home=cli_home)
    assert "whisper-base (stt" in table.stdout and "espeak-ng (tts" in table.stdout


def _identity(home):
    from reticulum_grid.node.identity import load_or_create
    return load_or_create(home / "identity").hash.hex()


def test_roles_voice_or_infer_and_nothing_else(hub, tower):
    me, data = hub.grid.identity_hash, spoken("Good morning.")
    try:
        revoke(tower.config_path, me)
        allow(tower.config_path, me, ["train"])
        with pytest.raises(WireError) as refused:
            _transcript(hub, data)
        assert refused.value.code == Code.NOT_ALLOWED and "--role voice" in refused.value.message
        with pytest.raises(WireError) as refused:
            hub.grid.speak("Good morning.", tower="voice-a")
        assert refused.value.code == Code.NOT_ALLOWED
        revoke(tower.config_path, me)
        allow(tower.config_path, me, ["infer"])
        assert wer("good morning", _transcript(hub, data).text) == 0
    finally:
        revoke(tower.config_path, me)
        allow(tower.config_path, me, ["voice"])


def test_busy_then_cancel_frees_the_engine(hub, tower, long_audio):
    stream = iter(hub.grid.transcribe(long_audio, tower="voice-a"))
    first = next(stream)  # the tower is transcribing now
    assert first.text
    with pytest.raises(WireError) as busy:
        _transcript(hub, spoken("Hello."))
    assert busy.value.code == Code.BUSY and busy.value.retry_after and busy.value.retry_after > 0
    stream.close()  # leaving early cancels the transcription on the tower
    cancelled = time.monotonic()
    deadline = cancelled + 10
    while "a cancel from the client" not in tower.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "a cancel from the client" in tower.log()
    # The engine stops at the end of the 30 s window it is decoding (CTranslate2 cannot be interrupted
    # inside one): free within that window's time at the speed it announced, never after the whole file.
    window_s = 30 / wait_voice(hub, "voice-a").caps.voices("stt")[0].realtime
    while True:
        try:
            text = _transcript(hub, spoken("Hello there.")).text
            break
        except WireError as e:
            assert e.code == Code.BUSY and time.monotonic() - cancelled < window_s + 5, e
            time.sleep(0.5)
    freed_s = time.monotonic() - cancelled
    print(f"admitted {freed_s:.1f} s after the cancel (a window takes {window_s:.1f} s here)")
    assert "hello" in text.lower()


def test_large_audio_goes_as_a_blob(hub, tower, monkeypatch):
    def loose_files():  # the client's store is the session's: other tests' blobs are there too
        return {i.blob_id for i in hub.grid.store.list() if i.kind == "file" and not i.aliases}

    data = spoken()
    monkeypatch.setattr(client_voice, "INLINE_MAX_BYTES", 1024)  # this note is ~15 kB as Opus
    before = loose_files()
    transcript = _transcript(hub, data)
    assert wer(SENTENCE, transcript.text) <= 0.2 and transcript.sent_bytes > 1024
    from reticulum_grid.store.blobstore import BlobStore
    assert not [i for i in BlobStore(tower.dir / "blobs").list() if i.kind == "file"], "the audio blob stayed"
    assert loose_files() <= before, "the client kept the audio blob it sent"


def test_undecodable_audio_is_refused(hub, tower):
    with pytest.raises(WireError) as refused:
        hub.grid.transcribe(b"this is not audio" * 50)
    assert refused.value.code == Code.BAD_REQUEST and "decoded" in refused.value.message
    # Sent anyway, past the client's own check: the tower answers the stream with bad_request.
    entry = wait_voice(hub, "voice-a")
    with pytest.raises(WireError) as refused:
        for _ in client_voice._stream(hub.grid, entry, "audio/transcribe", {"audio": b"junk" * 100}):
            pass
    assert refused.value.code == Code.BAD_REQUEST
    with pytest.raises(WireError) as refused:
        hub.grid.connection(entry).request("audio/speech", {"stream_id": 1, "text": "hi", "format": "mp3"})
    assert refused.value.code == Code.BAD_REQUEST and "format" in refused.value.message


def test_a_tower_lost_mid_transcript_is_replaced(hub, tower, long_audio):
    hub.start_tower("voice-b", models={}, roles=("voice",), voice=VOICE)
    wait_voice(hub, "voice-b")
    whole = _transcript(hub, long_audio)
    stream = hub.grid.transcribe(long_audio, model="whisper-base")
    pieces = iter(stream)
    first = next(pieces)
    serving = next(t for t in hub.towers if t.name == stream.tower)
    serving.kill()
    rest = list(pieces)
    segments, end = [first] + rest[:-1], rest[-1]
    assert stream.failovers == 1 and end.tower != serving.name
    starts = [s.start_s for s in segments]
    assert starts == sorted(starts) and len(set(starts)) == len(starts), "no segment twice"
    joined = " ".join(s.text for s in segments)
    print(f"uninterrupted: {whole.text!r}\nfailed over:   {joined!r}")
    assert wer(LONG, joined) <= 0.2 and wer(whole.text, joined) <= 0.2
