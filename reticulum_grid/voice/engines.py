"""A tower's voice engines: the configured ones, started and measured in the background, with admission.

Each ``[voice.ALIAS]`` table (node/config.py) becomes one engine: faster-whisper
for ``kind = "stt"``, espeak-ng for ``"tts"``. ``start()`` loads them on a
thread of its own (Whisper base takes ~2 s; the tower answers meanwhile) and
measures each one's speed on a known sentence, seconds of audio per second of
work (x real time), which the caps announce; an engine appears in the caps
once it is ready. Each engine runs one request at a time (a CTranslate2
model decodes one batch; espeak-ng is one child each) and lets
``queue_depth`` more wait, then answers busy, as a model's slots do
(inference/admission.py).
"""

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Self

from announce.caps import VoiceCap
from links.wire import Code, WireError
from reticulum_grid.inference.admission import ModelQueue
from reticulum_grid.node.voice_config import VoiceConfig
from reticulum_grid.voice import models, tts
from reticulum_grid.voice.audio import STT_RATE, Samples, decode, wav
from reticulum_grid.voice.stt import SpeechToText
from reticulum_grid.voice.tts import TextToSpeech

log = logging.getLogger("rngrid.voice")

#: The sentence engines are measured on at start (spoken by espeak-ng, then transcribed).
MEASURE_TEXT = "The tower in the north valley has two machines and one radio, and it answers every call."
#: First guess of one request's time (seconds), for the busy retry hint.
INITIAL_REQUEST_S = 5.0


class Engine:
    """A started voice engine: ``worker`` (SpeechToText or TextToSpeech),
    ``queue`` (its admission), ``realtime`` (x real time; 0 until measured),
    ``error`` (why it did not start, or "")."""

    def __init__(self, config: VoiceConfig, worker: "SpeechToText | TextToSpeech", queue_depth: int) -> None:
        self.config, self.worker = config, worker
        self.alias, self.kind, self.language = config.alias, config.kind, config.language
        self.queue = ModelQueue(queue_depth, slots=1, initial_request_s=INITIAL_REQUEST_S)
        self.realtime = 0.0
        self.error = ""

    @property
    def ready(self) -> bool:
        return self.realtime > 0

    def cap(self) -> VoiceCap:
        return VoiceCap(self.alias, self.kind, self.language, round(self.realtime, 1), self.queue.free)


def make_worker(config: VoiceConfig) -> SpeechToText | TextToSpeech:
    """The engine object for a VoiceConfig (nothing loaded yet)."""
    if config.kind == "stt":
        return SpeechToText(config.alias, config.path or "", device=config.device, threads=config.threads,
                            language=config.language)
    return TextToSpeech(config.alias, voice=config.voice, language=config.language)


class VoiceEngines:
    """``configs``: [VoiceConfig]; ``on_change()`` runs when an engine became
    ready (the tower re-announces)."""

    def __init__(self, configs: Iterable[VoiceConfig], queue_depth: int = 4,
                 on_change: Callable[[], None] | None = None) -> None:
        self.engines = [Engine(c, make_worker(c), queue_depth) for c in configs]
        self.on_change = on_change
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        """Load and measure the engines on a thread of their own."""
        if self.engines:
            self._thread = threading.Thread(target=self._start_all, name="rngrid-voice-start", daemon=True)
            self._thread.start()
        return self

    def wait(self, timeout: float) -> bool:
        """Wait (bounded) for the start-up thread; True when it ended."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _start_all(self) -> None:
        sample: Samples | None = None
        for engine in sorted(self.engines, key=lambda e: e.kind != "tts"):  # speech first: it is the STT sample
            try:
                worker = engine.worker
                if isinstance(worker, SpeechToText):  # kind "stt"
                    if not worker.path:
                        worker.path = str(models.install())
                    worker.load()
                    sample = sample if sample is not None else _sample(self.engines)
                    worker.measure(sample[:STT_RATE])  # warm-up: the first call sets up the decoder
                    engine.realtime = worker.measure(sample)
                else:
                    worker.load()
                    engine.realtime = worker.measure(MEASURE_TEXT)
                log.info("voice engine %s (%s) ready: %.1fx real time%s", engine.alias, engine.kind,
                         engine.realtime, " on the GPU" if getattr(engine.worker, "on_gpu", False) else "")
            except Exception as e:  # one broken engine must not keep the others (or the tower) down
                engine.error = f"{type(e).__name__}: {e}"
                log.error("voice engine %s (%s) did not start: %s", engine.alias, engine.kind, engine.error)
            if self.on_change is not None:
                self.on_change()

    def caps(self) -> tuple[VoiceCap, ...]:
        """VoiceCaps of the engines that are ready."""
        return tuple(e.cap() for e in self.engines if e.ready)

    def find(self, kind: str, alias: str | None = None) -> Engine:
        """The ready engine of ``kind`` named ``alias`` (None or "": the first
        of that kind). Raises WireError(unknown_model)."""
        for engine in self.engines:
            if engine.kind == kind and (not alias or engine.alias == alias):
                if engine.ready:
                    return engine
                why = engine.error or "it is still starting"
                raise WireError(Code.UNKNOWN_MODEL if engine.error else Code.BUSY,
                                f"voice engine {engine.alias} is not ready: {why}",
                                retry_after=None if engine.error else 2.0)
        have = ", ".join(f"{e.alias} ({e.kind})" for e in self.engines) or "none"
        what = f"{kind} engine {alias!r}" if alias else f"{kind} engine"
        raise WireError(Code.UNKNOWN_MODEL, f"no {what} on this tower; it has: {have}")

    def running(self) -> tuple[int, int]:
        """(requests running, requests waiting) over every engine."""
        return sum(e.queue.running for e in self.engines), sum(e.queue.waiting for e in self.engines)


def _sample(engines: list[Engine]) -> Samples:
    """MEASURE_TEXT spoken (float32, 16 kHz) by this tower's espeak-ng; without it, 8 s of
    a swept tone (the encoder's cost is what a sweep measures well; the decoder's is small)."""
    import numpy as np
    speaker = next((e.worker for e in engines if isinstance(e.worker, TextToSpeech) and e.ready), None)
    if speaker is None and tts.available():
        speaker = TextToSpeech("measure")
    if speaker is not None:
        pcm = b"".join(speaker.speak(MEASURE_TEXT))
        return decode(wav(pcm, speaker.rate))
    t = np.arange(8 * STT_RATE) / STT_RATE
    return (0.3 * np.sin(2 * np.pi * (200 + 100 * t) * t)).astype(np.float32)
