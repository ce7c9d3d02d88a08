"""A tower's voice commands (role ``voice`` or ``infer``): ``audio/transcribe`` and ``audio/speech``.

The contract is voice/request.py. Both answer ``{"stream_id", "queued"}`` at
once and stream on their own thread through tower/streams.py, so admission
(busy with a retry hint), cancel (a StreamCancel, or the Link closing) and
the end and error messages are those of ``ai/inference``.

Audio sent as a blob is fetched from the asking Link with the chunk protocol
(links/chunks.py: every chunk checked against the manifest, resumable) into
this tower's store, before the request takes its turn, and deleted once
transcribed.
"""

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from announce.caps import VoiceCap

from announce.capsfull import TEXT_MAX_BYTES, VoiceInfo
from links import manifest as manifests
from links.channel import clip
from links.commands import Command, bind
from links.wire import Code, WireError
from reticulum_grid.inference.generation import Generation, Piece
from reticulum_grid.store.blobstore import BlobInfo
from reticulum_grid.store.sync import fetch_blob
from reticulum_grid.tower.blobs import SessionSource
from reticulum_grid.tower.streams import start_stream
from reticulum_grid.voice import request as voice_request
from reticulum_grid.voice.audio import OPUS_BPS, STT_RATE, OpusWriter, Samples, decode
from reticulum_grid.voice.engines import Engine, VoiceEngines
from reticulum_grid.voice.request import MAX_AUDIO_BYTES, SpeechEnd, TranscribeRequest, TranscriptEnd, pack_segment
from reticulum_grid.voice.stt import SpeechToText, TranscriptInfo
from reticulum_grid.voice.tts import TextToSpeech

if TYPE_CHECKING:
    from reticulum_grid.tower.session import LinkSession
    from reticulum_grid.tower.parts import TowerParts

log = logging.getLogger("rngrid.tower")

class TowerVoice:
    def __init__(self, tower: "TowerParts") -> None:
        self.tower = tower
        self.engines = VoiceEngines(tower.config.voice, tower.config.queue_depth, on_change=self._changed)

    def start(self) -> "TowerVoice":
        self.engines.start()
        return self

    def _changed(self) -> None:
        if self.tower.announcer is not None:
            self.tower.announcer.request("voice engine ready")

    def commands(self) -> list[Command]:
        return [bind("audio/transcribe", self.transcribe), bind("audio/speech", self.speech)]

    def caps(self) -> tuple[VoiceCap, ...]:
        return self.engines.caps()

    def details(self) -> tuple[VoiceInfo, ...]:
        """caps/full's ``voice``: every configured engine, ready or not (and why)."""
        return tuple(VoiceInfo(e.alias, e.kind, e.language, round(e.realtime, 1), e.ready,
                               clip(e.error, TEXT_MAX_BYTES)) for e in self.engines.engines)

    # -- audio/transcribe ---------------------------------------------------
    def transcribe(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        r = voice_request.parse_transcribe(request)
        engine = self.engines.find("stt", r.model)
        if r.blob_id is not None:
            self._check_blob(r)

        def prepare() -> Samples:  # before the turn: fetching and decoding never hold the engine
            data = r.audio if r.audio is not None else self._fetch(session, r)
            samples = decode(data)
            return samples[int(r.offset_s * STT_RATE):]

        def generate(samples: Samples, result: Generation, cancel: threading.Event) -> Iterator[Piece]:
            started, info, count = time.perf_counter(), TranscriptInfo(), 0
            for segment in _stt(engine).transcribe(samples, info, r.language, cancel, r.offset_s, r.prompt):
                count += 1
                yield Piece(pack_segment(segment), [], 0)
            if cancel.is_set():
                result.finish_reason = "cancelled"
                return
            work_s = time.perf_counter() - started
            result.finish_reason = "stop"
            result.extra.update(TranscriptEnd(
                info.language, round(info.language_probability, 4), round(info.audio_s, 3), round(work_s, 4),
                round(info.audio_s / max(work_s, 1e-6), 2), 0.0, count, engine.alias, self.tower.config.name).to_map())

        return start_stream(session, r, engine.queue, generate, _usage, prepare=prepare, name="rngrid-stt")

    def _check_blob(self, r: TranscribeRequest) -> None:
        try:
            found = manifests.unpack(r.manifest, expected_id=r.blob_id)
        except manifests.ManifestError as e:
            raise WireError(Code.BAD_MANIFEST, f"the audio blob's manifest: {e}") from None
        if found.total_size > MAX_AUDIO_BYTES:
            raise WireError(Code.REQUEST_TOO_LARGE, f"the audio is {found.total_size} bytes, limit {MAX_AUDIO_BYTES}")

    def _fetch(self, session: "LinkSession", r: TranscribeRequest) -> bytes:
        """The audio blob's bytes, fetched from the asking Link, then dropped from the store."""
        store = self.tower.store
        # parse_transcribe: a request without audio names a blob and its manifest, which fetch_blob completes.
        blob_id, manifest = cast(bytes, r.blob_id), cast(bytes, r.manifest)
        info = cast(BlobInfo, fetch_blob(store, blob_id, manifest, [SessionSource(session)], kind="file")[0])
        try:
            return info.path.read_bytes()  # type: ignore[union-attr]  # a complete blob has a path
        finally:
            if not info.aliases:
                store.remove(blob_id.hex())

    # -- audio/speech -------------------------------------------------------
    def speech(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        r = voice_request.parse_speech(request)
        engine = self.engines.find("tts", r.model)
        voice = _tts(engine).check_voice(r.voice)
        wpm = r.wpm or None

        def generate(_: object, result: Generation, cancel: threading.Event) -> Iterator[Piece]:
            started, pcm_bytes = time.perf_counter(), 0
            opus = OpusWriter(_tts(engine).rate, r.bitrate or OPUS_BPS) if r.format == "opus" else None
            kwargs = {"wpm": wpm} if wpm else {}
            for pcm in _tts(engine).speak(r.text, voice, cancel=cancel, **kwargs):
                pcm_bytes += len(pcm)
                data = opus.write(pcm) if opus else pcm
                if data:
                    yield Piece(data, [], 0)
            if cancel.is_set():
                result.finish_reason = "cancelled"
                return
            if opus and (tail := opus.close()):
                yield Piece(tail, [], 0)
            work_s, audio_s = time.perf_counter() - started, pcm_bytes / 2 / _tts(engine).rate
            result.finish_reason = "stop"
            result.extra.update(SpeechEnd(r.format, _tts(engine).rate, round(audio_s, 3), round(work_s, 4),
                                          round(audio_s / max(work_s, 1e-6), 2), 0.0, voice, engine.alias,
                                          self.tower.config.name).to_map())

        reply = start_stream(session, r, engine.queue, generate, _usage, name="rngrid-tts")
        return {**reply, "sample_rate": _tts(engine).rate}


def _usage(result: Generation, queued_s: float) -> dict[str, Any]:
    return {**result.extra, "queued_s": round(queued_s, 4)}


def _stt(engine: Engine) -> SpeechToText:
    """The worker of an engine found by kind "stt"."""
    return cast(SpeechToText, engine.worker)


def _tts(engine: Engine) -> TextToSpeech:
    """The worker of an engine found by kind "tts"."""
    return cast(TextToSpeech, engine.worker)
