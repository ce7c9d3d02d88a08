"""Voice through `rngrid serve`: the real `openai` package's audio API, raw HTTP, the grid's
command API from Node.js, and the dashboard listing the voice tower, in front of a real voice
tower (espeak-ng, faster-whisper with the bundled Whisper base)."""

import json
from pathlib import Path

import httpx
import pytest

from reticulum_grid.voice.audio import STT_RATE, decode
from tests.gateway_support import node_test, openai_client
from testbed.requirements import need, needs
from testbed.voice_support import SENTENCE, VOICE, spoken, wait_voice, wer

pytestmark = [needs("espeak-ng", "the known sentence is spoken by espeak-ng"),
              needs("faster-whisper", "speech to text runs on faster-whisper")]
ROOT = Path(__file__).resolve().parents[2]
GATEWAY_BUSY_WAIT_S = 30  # how long the `gateway` fixture (tests/conftest.py) waits out a busy grid


@pytest.fixture(scope="module")
def tower(hub):
    t = hub.start_tower("voice-gw", models={}, roles=("voice",), voice=VOICE)
    wait_voice(hub, "voice-gw")
    yield t
    hub.stop_towers([t])


@pytest.fixture(scope="module")
def note(tmp_path_factory):
    path = tmp_path_factory.mktemp("voice") / "note.wav"
    path.write_bytes(spoken())
    return path


@pytest.fixture(scope="module")
def grid_text(hub, tower, note):
    return hub.grid.transcribe(note.read_bytes(), tower="voice-gw").transcript().text


@pytest.fixture
def client(gateway):
    return openai_client(gateway)


def test_openai_transcription_gives_the_grids_text(client, note, grid_text):
    with open(note, "rb") as f:
        reply = client.audio.transcriptions.create(model="whisper-1", file=f)
    print(f"openai client: {reply.text!r}; grid: {grid_text!r}")
    assert reply.text == grid_text and wer(SENTENCE, reply.text) <= 0.2
    with open(note, "rb") as f:
        verbose = client.audio.transcriptions.create(model="whisper-base", file=f, response_format="verbose_json")
    assert verbose.text == grid_text and verbose.language == "en" and verbose.segments
    assert abs(verbose.duration - len(decode(note.read_bytes())) / STT_RATE) < 0.1
    with open(note, "rb") as f:
        text = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="text")
    assert text.strip() == grid_text


def test_transcription_subtitles_and_stream(gateway, note, grid_text):
    files = {"file": ("note.wav", note.read_bytes(), "audio/wav")}
    srt = httpx.post(gateway + "/v1/audio/transcriptions", files=files, data={"response_format": "srt"}, timeout=120)
    assert srt.status_code == 200 and srt.text.startswith("1\n00:00:00,000 --> ") and grid_text in srt.text
    with httpx.stream("POST", gateway + "/v1/audio/transcriptions", files=files, data={"stream": "true"},
                      timeout=120) as reply:
        events = [json.loads(line[5:]) for line in reply.iter_lines() if line.startswith("data:")]
    assert [e["type"] for e in events][-1] == "transcript.text.done" and events[-1]["text"] == grid_text
    assert "".join(e["delta"] for e in events[:-1]) == grid_text


def test_bad_uploads_answer_400(gateway):
    junk = httpx.post(gateway + "/v1/audio/transcriptions", files={"file": ("x.wav", b"not audio" * 30)}, timeout=60)
    assert junk.status_code == 400 and junk.json()["error"]["code"] == "bad_request"
    none = httpx.post(gateway + "/v1/audio/transcriptions", files={"model": (None, "whisper-1")}, timeout=60)
    assert none.status_code == 400 and none.json()["error"]["param"] == "file"
    fmt = httpx.post(gateway + "/v1/audio/speech", json={"input": "hi", "response_format": "ogg"}, timeout=60)
    assert fmt.status_code == 400 and fmt.json()["error"]["param"] == "response_format"


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus"])
def test_openai_speech_is_heard_back(client, hub, fmt):
    reply = client.audio.speech.create(model="tts-1", voice="alloy", input=SENTENCE, response_format=fmt)
    data = reply.read()
    samples = decode(data)
    assert len(samples) / STT_RATE > 2
    heard = hub.grid.transcribe(data, tower="voice-gw").transcript().text
    print(f"{fmt}: {len(data)} bytes, heard {heard!r}")
    assert wer(SENTENCE, heard) <= 0.2


def test_node_client_voice_commands(gateway, tower, note, grid_text):
    need("node", "the JavaScript client runs under Node.js")
    run = node_test("voice.test.mjs", RNGRID_URL=gateway, RNGRID_AUDIO=str(note), RNGRID_EXPECT=grid_text,
                    RNGRID_TOWER=tower.name)
    assert run.returncode == 0 and "# pass 2" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]


def test_towers_view_and_dashboard_list_the_voice_tower(gateway, tower, tmp_path):
    rows = httpx.get(gateway + "/v1/grid/towers", timeout=30).json()["towers"]
    row = next(r for r in rows if r["name"] == "voice-gw")
    assert {(v["alias"], v["kind"]) for v in row["voice"]} == {("whisper-base", "stt"), ("espeak-ng", "tts")}
    need("chromium", "the dashboard is driven in a real browser")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        browser.get(gateway + "/")
        tags = WebDriverWait(browser, 30).until(lambda b: b.find_elements(
            By.CSS_SELECTOR, 'tr[data-tower="voice-gw"] .tag.voice'))
        assert sorted(t.text for t in tags) == ["espeak-ng (tts)", "whisper-base (stt)"]
    finally:
        browser.quit()
