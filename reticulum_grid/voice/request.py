"""The voice commands' contract: requests, the transcript's stream pieces, the end figures.

``audio/transcribe`` (role ``voice`` or ``infer``)::

    {"stream_id": int, "model": alias | None (any speech-to-text engine),
     "language": ISO 639-1 code | None (detected),
     "audio": bytes            # the file (any format FFmpeg reads), when small, or
     "blob_id": bytes, "manifest": bytes,   # a blob the tower fetches from the asking Link
     "offset_s": float,        # transcribe from here (seconds; a transcript continued elsewhere)
     "prompt": str}            # words to expect (names, terms), Whisper's initial prompt

-> ``{"stream_id", "queued"}`` at once; then one stream (links/stream.py)
whose chunks carry the segments, each a msgpack map ``{"s": start_s, "e":
end_s, "t": text}`` one after another (a chunk may hold several or part of
one: read them with SegmentReader), and whose end usage is a TranscriptEnd.

``audio/speech`` (role ``voice`` or ``infer``)::

    {"stream_id": int, "model": alias | None, "text": str (<= 4096 characters),
     "voice": espeak-ng voice | None, "wpm": words per minute | None,
     "format": "pcm" | "opus", "bitrate": Opus bits/s | None}

-> ``{"stream_id", "queued", "sample_rate"}``; then one stream of the audio
bytes (16-bit mono PCM at ``sample_rate`` Hz, or an Ogg Opus file) as it is
spoken, whose end usage is a SpeechEnd.
"""

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Self

import msgpack

from links.stream import MAX_STREAM_ID
from links.usage import USAGE_KIND, EndUsage
from links.wire import Code, Field, WireError, in_range, max_len, validate
from reticulum_grid.voice.audio import MAX_AUDIO_S, STREAM_FORMATS
from reticulum_grid.voice.tts import MAX_CHARS, WPM_RANGE

if TYPE_CHECKING:
    from reticulum_grid.voice import stt

#: Largest audio sent inside a request (bytes); larger goes as a blob. A
#: request over one packet travels as an RNS Resource, which resends its own parts.
INLINE_MAX_BYTES = 256 << 10
#: Largest audio blob a tower fetches for one request (bytes): 30 min at 64 kbit/s.
MAX_AUDIO_BYTES = 16 << 20
#: Longest segment text believed (characters): Whisper emits at most ~448 tokens per 30 s window.
MAX_SEGMENT_CHARS = 4096


def _name(v: str) -> str | None:
    return None if 0 < len(v) <= 32 and all(c.isalnum() or c in "-_.+" for c in v) else f"{v!r} is not a name"


_stream = Field(int, required=True, check=in_range(0, MAX_STREAM_ID))
TRANSCRIBE = {"stream_id": _stream, "model": Field(str, check=_name), "language": Field(str, check=_name),
              "audio": Field(bytes, check=max_len(INLINE_MAX_BYTES)), "blob_id": Field(bytes),
              "manifest": Field(bytes), "offset_s": Field(float, default=0.0, check=in_range(0.0, MAX_AUDIO_S)),
              "prompt": Field(str, check=max_len(1024))}
SPEECH = {"stream_id": _stream, "model": Field(str, check=_name), "text": Field(str, required=True,
                                                                                 check=max_len(MAX_CHARS)),
          "voice": Field(str, check=_name), "wpm": Field(int, check=in_range(*WPM_RANGE)),
          "format": Field(str, default="pcm", check=lambda v: None if v in STREAM_FORMATS else
                          f"format must be one of {', '.join(STREAM_FORMATS)}"),
          "bitrate": Field(int, check=in_range(6000, 256000))}


@dataclass
class TranscribeRequest:
    stream_id: int
    model: str | None
    language: str | None
    audio: bytes | None
    blob_id: bytes | None
    manifest: bytes | None
    offset_s: float
    prompt: str | None


@dataclass
class SpeechRequest:
    stream_id: int
    model: str | None
    text: str
    voice: str | None
    wpm: int | None
    format: str
    bitrate: int | None


def parse_transcribe(request: dict[str, Any]) -> TranscribeRequest:
    """A TranscribeRequest from a request map. Raises WireError(bad_request)."""
    r = TranscribeRequest(**validate(request, TRANSCRIBE))
    if (r.audio is None) == (r.blob_id is None):
        raise WireError(Code.BAD_REQUEST, "give the audio inside the request ('audio') or as a blob "
                                          "('blob_id' and 'manifest'), one of them")
    if r.blob_id is not None and r.manifest is None:
        raise WireError(Code.BAD_REQUEST, "an audio blob needs its 'manifest'")
    return r


def parse_speech(request: dict[str, Any]) -> SpeechRequest:
    """A SpeechRequest from a request map. Raises WireError(bad_request)."""
    r = SpeechRequest(**validate(request, SPEECH))
    if not r.text.strip():
        raise WireError(Code.BAD_REQUEST, "field 'text' holds nothing to say")
    return r


def pack_segment(segment: "stt.Segment") -> bytes:
    """A stt.Segment as the bytes it takes on the stream."""
    return msgpack.packb({"s": segment.start_s, "e": segment.end_s, "t": segment.text}, use_bin_type=True)


@dataclass(frozen=True)
class Segment:
    """A transcript segment as a client reads it: times in seconds from the audio's start."""
    start_s: float
    end_s: float
    text: str


class SegmentReader:
    """Segments out of a transcript stream's bytes, fed as they come (a
    segment may be split across chunks). Trusts nothing: ``feed`` raises
    WireError(bad_stream) for anything but {"s": number, "e": number, "t": str}."""

    def __init__(self) -> None:
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=1 << 20, strict_map_key=True)

    def feed(self, data: bytes) -> list["Segment"]:
        self._unpacker.feed(data)
        out = []
        try:
            for raw in self._unpacker:
                out.append(_segment(raw))
        except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as e:
            raise WireError("bad_stream", f"a transcript segment is not readable: {e}") from None
        return out


def _segment(raw: object) -> Segment:
    if not isinstance(raw, dict) or set(raw) != {"s", "e", "t"}:
        raise ValueError("not a map of s, e, t")
    start, end, text = raw["s"], raw["e"], raw["t"]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, end)):
        raise ValueError("times are not numbers")
    if not (0 <= start <= end <= 10 * MAX_AUDIO_S) or not isinstance(text, str) or len(text) > MAX_SEGMENT_CHARS:
        raise ValueError("times or text out of range")
    return Segment(float(start), float(end), text)


def _num(usage: dict[str, Any], key: str, kind: type[int] | type[float] = float) -> Any:
    value = usage.get(key, 0)
    return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else kind(0)


def _text(usage: dict[str, Any], key: str, limit: int) -> str:
    value = usage.get(key, "")
    return value[:limit] if isinstance(value, str) and value.isprintable() else ""


#: Longest text a voice end figure keeps (characters), by field; any other: 32.
_TEXT_MAX = {"language": 16, "format": 8}


@dataclass
class _VoiceEnd(EndUsage):
    """What the voice end shapes share: the map is the tagged fields, and each
    field reads back by its type (int, float or text)."""

    def to_map(self) -> dict[str, Any]:
        return {USAGE_KIND: self.KIND, **self.__dict__}

    @classmethod
    def from_map(cls, raw: object) -> Self:
        """Read from a StreamEnd's usage map, trusting no field."""
        usage = raw if isinstance(raw, dict) else {}
        return cls(*(_read(usage, f.name, f.type) for f in fields(cls)))


def _read(usage: dict[str, Any], key: str, kind: object) -> Any:
    """``usage[key]`` as a ``kind`` (str, int or float): text cut to its
    _TEXT_MAX, a value of another type read as "" or 0."""
    if kind is str:
        return _text(usage, key, _TEXT_MAX.get(key, 32))
    return _num(usage, key, int if kind is int else float)


@dataclass
class TranscriptEnd(_VoiceEnd):
    """A transcript stream's end figures: ``language`` (ISO 639-1) and its
    probability, ``audio_s`` (seconds of audio), ``work_s`` (the tower's
    seconds of work), ``realtime`` (audio_s / work_s), ``queued_s``,
    ``segments`` (count), ``model`` and ``tower``. Tagged ``"transcript"`` (links/usage.py)."""
    KIND: ClassVar[str] = "transcript"
    language: str
    language_probability: float
    audio_s: float
    work_s: float
    realtime: float
    queued_s: float
    segments: int
    model: str
    tower: str


@dataclass
class SpeechEnd(_VoiceEnd):
    """A speech stream's end figures: ``format`` ("pcm" or "opus"),
    ``sample_rate`` (Hz of the PCM), ``audio_s`` (seconds spoken), ``work_s``,
    ``realtime`` (audio_s / work_s), ``queued_s``, ``voice``, ``model``, ``tower``. Tagged ``"speech"``."""
    KIND: ClassVar[str] = "speech"
    format: str
    sample_rate: int
    audio_s: float
    work_s: float
    realtime: float
    queued_s: float
    voice: str
    model: str
    tower: str
