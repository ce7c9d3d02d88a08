"""Shared by the voice tests and bench/voice.py: a known sentence spoken by espeak-ng, word error rate, a voice tower."""

import re
import time

from reticulum_grid.voice.audio import wav
from reticulum_grid.voice.tts import TextToSpeech

#: Spoken by espeak-ng and transcribed by Whisper base (measured: every word right, WAV and Opus 12 kbit/s).
SENTENCE = "Please send the weather report to the base camp before noon."
#: A long text about towers, a sentence an item: its first six spoken are ~30 s
#: (bench/voice.py), all seven ~40 s (two of Whisper's 30 s windows).
TOWERS = [
    "The first tower stands in the north valley and listens to the radio every night.",
    "The second tower stands near the river and keeps the maps of the whole region.",
    "The third tower sits on the hill above the village and answers every call it hears.",
    "The fourth tower is new and still learns the names of the roads and the bridges.",
    "When the weather turns bad the towers share their reports with the base camp.",
    "Each report names the wind, the rain and the temperature at seven in the morning.",
    "The base camp reads them all and sends a short summary back before noon.",
]
#: Both engines, as a tower's [voice] tables.
VOICE = {"whisper-base": {"kind": "stt", "threads": 1}, "espeak-ng": {"kind": "tts"}}


def words(text):
    """Lower-case words without punctuation (what word error rate compares)."""
    return re.findall(r"[a-z0-9']+", text.lower())


def wer(reference, hypothesis):
    """Word error rate: (substitutions + deletions + insertions) / reference words (Levenshtein on words)."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(1, len(ref))


def spoken(text=SENTENCE, wpm=150):
    """``text`` as a WAV file's bytes, spoken here by espeak-ng."""
    speaker = TextToSpeech("local")
    return wav(b"".join(speaker.speak(text, wpm=wpm)), speaker.rate)


def wait_voice(hub, name, kinds=("stt", "tts"), timeout=120.0):
    """The table entry of tower ``name`` once its caps list ready engines of ``kinds``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entry = hub.grid.table.find(name)
        if entry and all(entry.caps.voices(k) for k in kinds):
            return entry
        hub.grid.ping(force=True)
        time.sleep(0.5)
    raise AssertionError(f"tower {name} did not announce voice engines {kinds} within {timeout:.0f} s")
