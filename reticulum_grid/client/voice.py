"""Voice on the grid: ``audio/transcribe`` and ``audio/speech``, routed and failed over like inference.

Routing is router.rank_voice (towers whose caps list an engine of the kind,
name and language asked). A tower that refuses or fails before any output
(busy, gone, not allowed, ...) is skipped and the next one asked. A tower
that dies in the middle of a transcript is replaced: the next one transcribes
from the end of the last segment that arrived (``offset_s``), so the joined
transcript has every segment once. Speech that broke off after its first
audio is not continued elsewhere (another tower's voice need not match the
same sample); the error says how far it got.

Audio crosses each link compressed for it (voice/audio.py): as it is when it
is already small, else as Ogg Opus at 12 kbit/s on a radio-class link
(interface at most 62.5 kbit/s, a set-up rate below 10 kbit/s, or RNS's
500-byte MTU) and 32 kbit/s on others. Up to INLINE_MAX_BYTES it travels
inside the request (as an RNS Resource when over one packet); larger audio
is offered as a blob that the tower fetches with the chunk protocol. Speech
comes back as PCM on fast links and as Opus on radio-class ones, turned into
the format asked for here.
"""

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import RNS

from announce.table import TowerEntry

from links.channel import ChannelRouter
from links.stream import MAX_STREAM_ID, TokenEvent
from links.usage import decode_usage
from links.wire import Code, WireError
from reticulum_grid.client import router
from reticulum_grid.client.parts import GridParts
from reticulum_grid.client.stream import CONTINUE_AFTER, MAX_TOWERS, RETRY_BEFORE_OUTPUT, STREAM_SILENCE_S
from reticulum_grid.node.connection import TowerConnection
from reticulum_grid.store.sync import MAX_TRANSFER_S, SLOW_SETUP_BPS, check_duration
from reticulum_grid.voice import audio
from reticulum_grid.voice.request import INLINE_MAX_BYTES, Segment, SegmentReader, SpeechEnd, TranscriptEnd
from reticulum_grid.voice.tts import RATE


#: Seconds a transcript stream may be silent before its tower counts as gone
#: (a Whisper window on a slow CPU takes seconds, and heartbeats keep coming).
TRANSCRIPT_SILENCE_S = STREAM_SILENCE_S


@dataclass
class Transcript:
    """A whole transcript: ``text`` (the segments' text joined by spaces),
    ``segments`` (Segment: start_s, end_s, text), ``end`` (TranscriptEnd of the
    last tower), ``failovers`` (towers replaced mid-stream), ``sent_bytes`` (audio
    bytes sent to that tower) and ``sent_as`` ("original" or "opus")."""
    text: str
    segments: list[Segment]
    end: TranscriptEnd
    failovers: int = 0
    sent_bytes: int = 0
    sent_as: str = ""


@dataclass
class Speech:
    """Spoken audio: ``data`` in ``format`` (audio.FORMATS: wav, pcm, opus, flac, mp3, aac), ``end``
    (SpeechEnd: sample rate, seconds, the tower's speed), ``received_bytes``
    (what crossed the link) and ``received_as`` ("pcm" or "opus")."""
    data: bytes
    format: str
    end: SpeechEnd
    received_bytes: int = 0
    received_as: str = ""

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_bytes(self.data)


def slow_link(conn: TowerConnection) -> bool:
    """True when ``conn``'s Link (a TowerConnection's, established) is radio-class."""
    link = conn.link
    rate = link.get_establishment_rate() if link is not None else None
    # established: ensure_link set the router
    return bool(cast(ChannelRouter, conn.router).on_radio() or (rate and rate < SLOW_SETUP_BPS)
                or (link is not None and (link.mtu or 0) <= RNS.Reticulum.MTU))


def rank(grid: GridParts, kind: str, model: str | None = None, language: str | None = None, tower: str | None = None,
         audio_s: float = 5.0, timeout: float = 15.0) -> list[router.VoiceChoice]:
    """VoiceChoices for ``kind`` ("stt"/"tts"), best first, with live load
    refreshed. Raises WireError: no_tower when none was heard, unknown_model
    when no tower heard has such an engine."""
    def ready(entries: list[TowerEntry]) -> list[router.VoiceChoice]:
        return router.rank_voice(entries, kind, model, language)

    entries = [grid.find_tower(tower, timeout)] if tower else grid.discover(ready, timeout)
    grid.refresh([c.entry for c in ready(entries) if not grid.health.get(c.entry.destination_hash).backed_off()])
    live = [grid.table.get(e.destination_hash) or e for e in entries]
    ranked = router.rank_voice(live, kind, model, language, audio_s, grid.health)
    if not ranked:
        what = {"stt": "speech to text", "tts": "text to speech"}[kind]
        named = f" {model!r}" if model else ""
        spoken = f" for language {language!r}" if language else ""
        heard = ", ".join(f"{e.name} ({', '.join(v.alias for v in e.caps.voice) or 'no voice'})" for e in live)
        raise WireError(Code.UNKNOWN_MODEL if live else Code.NO_TOWER,
                        f"no tower with a {what} engine{named}{spoken} heard; heard: {heard or 'none'}")
    return ranked


class _Attempts:
    """What failed so far in one request, for the final error."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.errors: list[tuple[str, WireError]] = []

    def failed(self, grid: GridParts, entry: TowerEntry, error: WireError, busy: bool = False) -> None:
        self.errors.append((entry.name, error))
        if not busy:
            grid.liveness.failed(entry, error)

    def exhausted(self) -> WireError:
        tried = "; ".join(f"{name}: {e.code}: {e.message}" for name, e in self.errors) or "none"
        codes = [e.code for _, e in self.errors]
        code = codes[0] if len(set(codes)) == 1 else Code.UNREACHABLE
        busy = [e.retry_after or 0.0 for _, e in self.errors if e.code == Code.BUSY]
        return WireError(code, f"no tower could {self.what}; tried {tried}",
                         retry_after=min(busy) if code == Code.BUSY and busy else None)


def _stream(grid: GridParts, entry: TowerEntry, command: str,
            payload: dict[str, Any]) -> Iterator[bytes | dict[str, Any]]:
    """Run one streamed voice command on ``entry``: yields each chunk's bytes,
    then the end's usage map (a dict) last. Leaving early (an error, a break,
    Ctrl-C) cancels the work on the tower. Raises WireError."""
    conn = grid.connection(entry)
    stream_id = secrets.randbelow(MAX_STREAM_ID)
    bound = grid.liveness.attempt_timeout(entry)
    receiver = conn.open_stream(stream_id, link_timeout=bound)
    grid.health.started(entry.destination_hash)
    ended = False
    try:
        # A request carrying audio may take many round trips to arrive (a Resource on a radio link).
        size = len(payload.get("audio") or b"")
        per_byte = RNS.Transport.next_hop_per_byte_latency(entry.destination_hash) or 0.0
        conn.request(command, {**payload, "stream_id": stream_id}, bound + 3 * size * per_byte, link_timeout=bound)
        silence = max(TRANSCRIPT_SILENCE_S, 10 * (cast(RNS.Link, conn.link).rtt or 0.0))  # set up by open_stream
        for event in receiver.events(silence, conn.router):
            if isinstance(event, TokenEvent):
                yield event.data
                continue
            ended = True
            grid.health.succeeded(entry.destination_hash)
            yield event.usage if isinstance(event.usage, dict) else {}
            return
        raise WireError(Code.INTERNAL, f"tower {entry.name} ended the {command} stream without its end")
    finally:
        if not ended and conn.link is not None and conn.link.status == RNS.Link.ACTIVE:
            conn.cancel(stream_id)
        conn.close_stream(stream_id)
        grid.health.ended(entry.destination_hash)


class TranscriptStream:
    """Iterator of Segment items as they are decoded, then one TranscriptEnd.
    ``transcript()`` reads it whole into a Transcript. ``data``: the audio
    file's bytes; ``options``: model, language, prompt, tower, force.
    ``tower``: the name of the tower transcribing now (or last)."""

    def __init__(self, grid: GridParts, data: bytes | bytearray, model: str | None = None, language: str | None = None,
                 prompt: str | None = None, tower: str | None = None, force: bool = False) -> None:
        self.grid, self.data, self.force = grid, bytes(data), force
        self.payload: dict[str, Any] = {k: v for k, v in (("model", model), ("language", language),
                                                          ("prompt", prompt)) if v}
        self.audio_s = audio.probe(self.data)  # refuse what cannot be decoded before asking anyone
        self.choices = rank(grid, "stt", model, language, tower, self.audio_s)[:MAX_TOWERS]
        self.segments: list[Segment] = []
        self.end: TranscriptEnd | None = None
        self.failovers = 0
        self.sent_bytes, self.sent_as = 0, ""
        self.tower: str | None = None
        self._encoded: dict[bool, tuple[bytes, str]] = {}

    def __iter__(self) -> Iterator[Segment | TranscriptEnd | None]:
        attempts = _Attempts(f"transcribe with {self.payload.get('model') or 'any speech-to-text engine'}")
        for choice in self.choices:
            try:
                yield from self._attempt(choice.entry)
                yield self.end
                return
            except WireError as e:
                output = len(self.segments) > 0
                if not (e.code in RETRY_BEFORE_OUTPUT and not output or e.code in CONTINUE_AFTER and output):
                    raise
                attempts.failed(self.grid, choice.entry, e, busy=e.code == Code.BUSY)
                self.failovers += output
        raise attempts.exhausted()

    def _attempt(self, entry: TowerEntry) -> Iterator[Segment]:
        conn = self.grid.connection(entry)
        conn.ensure_link(self.grid.liveness.attempt_timeout(entry))
        data, sent_as = self._for_link(conn)
        payload = dict(self.payload)
        if self.segments:
            payload["offset_s"] = float(self.segments[-1].end_s)
        offered: bytes | None = None
        if len(data) <= INLINE_MAX_BYTES:
            payload["audio"] = data
        else:
            offered = self._offer(conn, data, payload)
        self.sent_bytes, self.sent_as, self.tower = len(data), sent_as, entry.name
        reader = SegmentReader()
        try:
            for item in _stream(self.grid, entry, "audio/transcribe", payload):
                if isinstance(item, dict):
                    self.end = decode_usage(item, TranscriptEnd)
                    return
                for segment in reader.feed(item):
                    self.segments.append(segment)
                    yield segment
        finally:
            if offered is not None:
                self._forget(conn, offered)

    def _for_link(self, conn: TowerConnection) -> tuple[bytes, str]:
        slow = slow_link(conn)
        if slow not in self._encoded:
            self._encoded[slow] = audio.for_link(self.data, audio.RADIO_LINK_BPS if slow else None, self.audio_s)
        data, sent_as = self._encoded[slow]
        if slow and not self.force:
            check_duration(len(data), cast(RNS.Link, conn.link).get_establishment_rate(), "the audio",
                           MAX_TRANSFER_S)  # slow_link read the established Link
        return data, sent_as

    def _offer(self, conn: TowerConnection, data: bytes, payload: dict[str, Any]) -> bytes:
        store = self.grid.store
        path = self.grid.home / "audio" / f"{secrets.token_hex(8)}.audio"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        info = store.add_file(path, kind="file", copy=True)
        path.unlink()
        conn.offer(info.blob_id, store.read_chunk)
        payload.update(blob_id=info.blob_id, manifest=store.manifest_bytes(info.blob_id))
        return info.blob_id

    def _forget(self, conn: TowerConnection, blob_id: bytes) -> None:
        conn.offered.pop(blob_id, None)
        try:
            self.grid.store.remove(blob_id.hex())
        except WireError:
            pass

    def transcript(self) -> Transcript:
        """The whole Transcript (reads the stream to its end). Raises WireError."""
        for _ in self:
            pass
        # The iteration ends normally only after _attempt set the end.
        return Transcript(" ".join(s.text for s in self.segments if s.text).strip(), list(self.segments),
                          cast(TranscriptEnd, self.end), self.failovers, self.sent_bytes, self.sent_as)


def speak(grid: GridParts, text: str, model: str | None = None, voice: str | None = None, wpm: int | None = None,
          fmt: str = "wav", tower: str | None = None) -> Speech:
    """``text`` spoken by the best tower with a text-to-speech engine: a Speech
    in ``fmt`` (audio.FORMATS). Raises WireError."""
    if fmt not in audio.FORMATS:
        raise WireError(Code.BAD_REQUEST, f"unknown audio format {fmt!r}; formats: {', '.join(audio.FORMATS)}")
    payload = {k: v for k, v in (("model", model), ("text", text), ("voice", voice), ("wpm", wpm)) if v}
    attempts = _Attempts(f"speak with {model or 'any text-to-speech engine'}")
    # a guess of the audio's length for the ranking: ~15 characters a second
    for choice in rank(grid, "tts", model, None, tower, max(1.0, len(text) / 15))[:MAX_TOWERS]:
        received = bytearray()
        try:
            conn = grid.connection(choice.entry)
            conn.ensure_link(grid.liveness.attempt_timeout(choice.entry))
            wire_format = "opus" if slow_link(conn) else "pcm"
            asked = {**payload, "format": wire_format}
            if wire_format == "opus":
                asked["bitrate"] = audio.OPUS_RADIO_BPS
            for item in _stream(grid, choice.entry, "audio/speech", asked):
                if isinstance(item, dict):
                    usage = item
                else:
                    received += item
        except WireError as e:
            if e.code not in RETRY_BEFORE_OUTPUT or received:
                if received:
                    raise WireError(e.code, f"tower {choice.entry.name} stopped after {len(received)} bytes of "
                                            f"audio: {e.message}") from None
                raise
            attempts.failed(grid, choice.entry, e, busy=e.code == Code.BUSY)
            continue
        end = decode_usage(usage, SpeechEnd)
        rate = end.sample_rate or RATE
        if wire_format == "opus":
            data = received if fmt == "opus" else audio.convert(audio.pcm16(audio.decode(bytes(received), rate)),
                                                                rate, fmt)
        else:
            data = audio.convert(bytes(received), rate, fmt)
        return Speech(bytes(data), fmt, end, len(received), wire_format)
    raise attempts.exhausted()


def execute(grid: GridParts, command: str, payload: object, tower: str | None = None) -> "TranscriptStream | Speech":
    """``Grid.execute`` of ``audio/transcribe`` (a TranscriptStream) or
    ``audio/speech`` (a Speech): ``payload`` checked, then transcribe() or
    speak(). Raises WireError(bad_request)."""
    if not isinstance(payload, dict):
        raise WireError(Code.BAD_REQUEST, f"{command} needs a payload map")
    known = {"audio/transcribe": {"audio", "file", "model", "language", "prompt"},
             "audio/speech": {"text", "model", "voice", "wpm", "format"}}[command]
    if set(payload) - known:
        unknown = ", ".join(sorted(set(payload) - known))
        raise WireError(Code.BAD_REQUEST, f"unknown field(s) for {command}: {unknown}")
    if command == "audio/speech":
        if not isinstance(payload.get("text"), str):
            raise WireError(Code.BAD_REQUEST, "audio/speech needs a 'text' string")
        return speak(grid, payload["text"], payload.get("model"), payload.get("voice"), payload.get("wpm"),
                     payload.get("format", "wav"), tower=tower)
    data = payload.get("audio")
    if data is None and isinstance(payload.get("file"), str):
        data = Path(payload["file"]).read_bytes()
    if not isinstance(data, (bytes, bytearray)):
        raise WireError(Code.BAD_REQUEST, "audio/transcribe needs 'audio' (the file's bytes) or 'file' (a path)")
    return transcribe(grid, data, payload.get("model"), payload.get("language"), payload.get("prompt"), tower)


def transcribe(grid: GridParts, data: bytes | bytearray, model: str | None = None, language: str | None = None,
               prompt: str | None = None, tower: str | None = None, force: bool = False) -> "TranscriptStream":
    """A TranscriptStream of an audio file's bytes (``Grid.transcribe``).
    Raises WireError (bad_request for audio that cannot be decoded)."""
    try:
        return TranscriptStream(grid, data, model, language, prompt, tower, force)
    except ValueError as e:  # audio.AudioError
        raise WireError(Code.BAD_REQUEST, str(e)) from None
