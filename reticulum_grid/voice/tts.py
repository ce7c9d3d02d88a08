"""Text to speech with Debian's espeak-ng (formant synthesis, ~130 languages, no model files).

One ``espeak-ng --stdout`` child per request reads the text on its stdin
(never as an argument, so no text is taken for an option) and writes a WAV
stream as it speaks; ``TextToSpeech.speak`` yields its 16-bit mono PCM
(22,050 Hz) in pieces as they come, so the first audio leaves long before a
long text is spoken. A cancel or a bound (``SPEAK_S_PER_CHAR``) kills the
child. Voices are the language names ``espeak-ng --voices`` lists ("en-us",
"de", "fr", ...).
"""

import io
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import cast

ESPEAK = "espeak-ng"
#: espeak-ng's output rate (Hz), checked against each stream's header.
RATE = 22050
#: Bytes of PCM read from the child at a time (0.1 s).
READ_BYTES = 4410
#: Longest text one request may speak (characters; OpenAI's speech API takes 4096).
MAX_CHARS = 4096
#: Words per minute espeak-ng speaks at by default (its own default is 175;
#: a little slower is understood better, by people and by speech to text).
DEFAULT_WPM = 150
WPM_RANGE = (80, 450)
#: Seconds of work allowed per character of text, and at least (a bound, far above espeak-ng's ~50x real time).
SPEAK_S_PER_CHAR = 0.05
SPEAK_MIN_S = 10.0
DEFAULT_VOICE = "en-us"


class SpeechError(RuntimeError):
    """espeak-ng failed or is missing; the message says why."""


def available() -> bool:
    """True when the espeak-ng command is installed."""
    return shutil.which(ESPEAK) is not None


def voices() -> set[str]:
    """The voice (language) names espeak-ng lists. Raises SpeechError."""
    if not available():
        raise SpeechError(f"{ESPEAK} is not installed (as root: apt-get install espeak-ng; make setup does it)")
    listed = subprocess.run([ESPEAK, "--voices"], capture_output=True, text=True, timeout=30)
    return {line.split()[1] for line in listed.stdout.splitlines()[1:] if len(line.split()) > 1}


class TextToSpeech:
    """espeak-ng as a voice engine: ``voice`` is the default voice, ``language``
    what the tower announces for it ("" for any)."""

    kind = "tts"
    rate = RATE

    def __init__(self, alias: str, voice: str = DEFAULT_VOICE, language: str = "") -> None:
        self.alias, self.voice, self.language = alias, voice, language
        self._voices: set[str] | None = None
        self._lock = threading.Lock()

    def load(self) -> set[str]:
        """Read espeak-ng's voice list (once). Raises SpeechError."""
        with self._lock:
            if self._voices is None:
                self._voices = voices()
                if self.voice not in self._voices:
                    raise SpeechError(f"espeak-ng has no voice {self.voice!r}")
            return self._voices

    def check_voice(self, voice: str | None) -> str:
        """``voice`` (or the default for None/"") if espeak-ng has it; raises ValueError."""
        voice = voice or self.voice
        known = self.load()
        if voice not in known:
            raise ValueError(f"no voice {voice!r}; espeak-ng speaks {len(known)} languages, "
                             "e.g. en-us, en-gb, de, fr, es (espeak-ng --voices)")
        return voice

    def speak(self, text: str, voice: str | None = None, wpm: float = DEFAULT_WPM,
              cancel: threading.Event | None = None) -> Iterator[bytes]:
        """16-bit mono PCM at RATE Hz, in pieces as espeak-ng speaks ``text``.
        Raises ValueError (bad voice or text), SpeechError."""
        voice = self.check_voice(voice)
        proc = subprocess.Popen([ESPEAK, "-v", voice, "-s", str(int(wpm)), "--stdout"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin is not None and proc.stderr is not None  # pipes, as asked
        stdout, stderr = cast(io.BufferedReader, proc.stdout), proc.stderr  # a buffered pipe (Popen's default)
        deadline = time.monotonic() + max(SPEAK_MIN_S, SPEAK_S_PER_CHAR * len(text))
        watchdog = threading.Thread(target=_watch, args=(proc, cancel, deadline), daemon=True)
        watchdog.start()
        try:
            proc.stdin.write(text.encode("utf-8"))
            proc.stdin.close()
            header = _read_exactly(stdout, 44)
            if len(header) < 44 or header[:4] != b"RIFF" or header[36:40] != b"data":
                raise SpeechError(f"espeak-ng wrote no WAV stream: {stderr.read(500).decode(errors='replace')}")
            rate = struct.unpack("<I", header[24:28])[0]
            if rate != RATE:
                raise SpeechError(f"espeak-ng spoke at {rate} Hz, not {RATE}")
            while piece := stdout.read1(READ_BYTES):
                yield piece
            if proc.wait(5) != 0 and not (cancel is not None and cancel.is_set()):
                raise SpeechError(f"espeak-ng ended with status {proc.returncode}")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
            for stream in (stdout, stderr):
                stream.close()

    def measure(self, text: str = "The quick brown fox jumps over the lazy dog.") -> float:
        """Speed: seconds of speech per second of work (x real time)."""
        started = time.perf_counter()
        nbytes = sum(len(p) for p in self.speak(text))
        return nbytes / 2 / RATE / max(time.perf_counter() - started, 1e-6)


def _read_exactly(stream: io.BufferedReader, n: int) -> bytes:
    data = b""
    while len(data) < n and (more := stream.read1(n - len(data))):
        data += more
    return data


def _watch(proc: subprocess.Popen[bytes], cancel: threading.Event | None, deadline: float) -> None:
    """Kill ``proc`` once ``cancel`` is set or ``deadline`` (monotonic seconds) passes."""
    while proc.poll() is None:
        if (cancel is not None and cancel.is_set()) or time.monotonic() > deadline:
            proc.kill()
            return
        time.sleep(0.05)
