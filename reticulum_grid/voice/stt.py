"""Speech to text with faster-whisper (CTranslate2's Whisper), one loaded model per engine.

``SpeechToText.transcribe`` yields the transcript segment by segment as the
decoder produces them (faster-whisper decodes 30 s windows one after
another), with start and end times in seconds from the audio's start; the
language is detected from the first 30 s unless given. The model is read
from a local directory only (the bundled Whisper base, voice/models.py, or a
``path`` in the config): ``local_files_only`` and HF_HUB_OFFLINE keep
faster-whisper from asking a model hub.
"""

import ctypes
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from reticulum_grid.voice.audio import STT_RATE, Samples

log = logging.getLogger("rngrid.voice")

#: Libraries CTranslate2's CUDA build loads at its first CUDA call (CUDA 12, cuDNN 9): missing
#: ones abort the process there, so "auto" takes the GPU only when they load now.
CUDA_LIBRARIES = ("libcublas.so.12", "libcudnn_ops.so.9")
#: Beam width of the decoder (faster-whisper's default; 1 is greedy and faster but misses more words).
BEAM_SIZE = 5


@dataclass(frozen=True)
class Segment:
    """One stretch of the transcript: ``start_s``/``end_s`` in seconds from the audio's start."""
    start_s: float
    end_s: float
    text: str


@dataclass
class TranscriptInfo:
    """What the decoder found: ``language`` (ISO 639-1 code), its probability
    (1.0 when it was given), ``audio_s`` (seconds of audio transcribed)."""
    language: str = ""
    language_probability: float = 0.0
    audio_s: float = 0.0


def cuda_usable() -> bool:
    """True when CTranslate2 sees a CUDA GPU and the CUDA libraries it needs load (else it says why in the log)."""
    import ctranslate2
    if ctranslate2.get_cuda_device_count() == 0:
        return False
    for name in CUDA_LIBRARIES:
        try:
            ctypes.CDLL(name)
        except OSError:
            log.warning("a GPU is here but %s does not load, so speech to text runs on the CPU (pip install "
                        "nvidia-cublas-cu12 nvidia-cudnn-cu12 and put their lib folders on LD_LIBRARY_PATH)", name)
            return False
    return True


class SpeechToText:
    """A faster-whisper model from the directory ``path``. ``device``: "auto"
    (CUDA when cuda_usable(), else the CPU), "cpu" or "cuda";
    ``compute_type``: CTranslate2's ("auto": int8 on a CPU, float16 on a GPU);
    ``threads``: CPU threads (0: CTranslate2's default)."""

    kind = "stt"

    def __init__(self, alias: str, path: str, device: str = "auto", compute_type: str = "auto", threads: int = 0,
                 language: str = "") -> None:
        self.alias, self.path, self.language = alias, str(path), language
        self.device, self.compute_type, self.threads = device, compute_type, threads
        self._model: Any = None  # faster_whisper.WhisperModel, once loaded
        self._lock = threading.Lock()

    def load(self) -> Any:
        """Load the model (once). Raises what faster-whisper raises (a missing or broken model)."""
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                from faster_whisper import WhisperModel
                device = self.device if self.device != "auto" else "cuda" if cuda_usable() else "cpu"
                self._model = WhisperModel(self.path, device=device, compute_type=self.compute_type,
                                           cpu_threads=self.threads, local_files_only=True)
            return self._model

    @property
    def on_gpu(self) -> bool:
        return self._model is not None and self._model.model.device == "cuda"

    def transcribe(self, samples: Samples, info: TranscriptInfo, language: str | None = None,
                   cancel: threading.Event | None = None, offset_s: float = 0.0,
                   prompt: str | None = None) -> Iterator[Segment]:
        """Segments of ``samples`` (float32, 16 kHz mono) as they are decoded;
        ``info`` (a TranscriptInfo) is filled before the first one. ``language``:
        an ISO 639-1 code, or None to detect it (or the engine's configured
        language). ``offset_s`` is added to every time (a transcript continued
        from there). Stops between segments once ``cancel`` (an Event) is set."""
        model = self.load()
        segments, found = model.transcribe(samples, language=language or self.language or None, beam_size=BEAM_SIZE,
                                           initial_prompt=prompt or None, condition_on_previous_text=False)
        info.language, info.audio_s = found.language, len(samples) / STT_RATE
        info.language_probability = 1.0 if language else float(found.language_probability)
        for segment in segments:
            if cancel is not None and cancel.is_set():
                return
            yield Segment(round(offset_s + segment.start, 3), round(offset_s + segment.end, 3), segment.text.strip())

    def measure(self, samples: Samples) -> float:
        """Speed on ``samples`` (float32, 16 kHz): seconds of audio per second of work (x real time)."""
        started = time.perf_counter()
        for _ in self.transcribe(samples, TranscriptInfo(), language="en"):
            pass
        return len(samples) / STT_RATE / max(time.perf_counter() - started, 1e-6)
