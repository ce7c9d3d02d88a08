"""Audio as it crosses the grid: decoding what a user gives, and the codecs for the links it travels.

Everything is mono. Speech to text works on float32 samples at 16 kHz
(``STT_RATE``, what Whisper's feature extractor takes); espeak-ng speaks
16-bit PCM at 22,050 Hz. On the wire audio goes as it came when that is
already small, else as Ogg Opus (RFC 7845) at a bitrate chosen for the link:
``OPUS_RADIO_BPS`` on a radio-class link (a 5 s voice note is ~7.5 kB), else
``OPUS_BPS``. Opus is encoded and every format decoded through PyAV
(FFmpeg's libopus and demuxers), which faster-whisper already depends on.

Measured on espeak-ng's speech with Whisper base (beam 5, three sentences):
Opus at 8 kbit/s changed 4 words in 33, at 12 kbit/s 2, as did the WAV itself.

Decoding trusts nothing: a file that FFmpeg cannot read raises AudioError,
and one that decodes to more than ``MAX_AUDIO_S`` seconds is refused before
it is all in memory (a small file may hold hours of silence).
"""

import io
import struct
from types import ModuleType

import numpy as np
import numpy.typing as npt

#: Float32 samples in [-1, 1], mono.
Samples = npt.NDArray[np.float32]
#: Bytes as they come from a request, a file or a stream.
Bytes = bytes | bytearray | memoryview

#: Sample rate speech to text runs at (Hz).
STT_RATE = 16000
#: Longest audio one request may carry (seconds).
MAX_AUDIO_S = 1800.0
#: Opus bitrates (bits/s): on a radio-class link, and on any other.
OPUS_RADIO_BPS = 12000
OPUS_BPS = 32000
#: A link at or below this many bits/s is radio-class (links.channel.RADIO_BPS's figure).
RADIO_LINK_BPS = 62500
#: Audio already at most this many times the Opus bitrate the link gets is sent as it is.
KEEP_RATIO = 1.5
#: Formats a tower streams speech in, and what a client can turn PCM into.
STREAM_FORMATS = ("pcm", "opus")
FORMATS = ("wav", "pcm", "opus", "flac", "mp3", "aac")
MIME = {"wav": "audio/wav", "pcm": "audio/pcm", "opus": "audio/ogg", "flac": "audio/flac", "mp3": "audio/mpeg",
        "aac": "audio/aac"}


class AudioError(ValueError):
    """Audio that cannot be decoded or encoded; the message says why."""


def _av() -> ModuleType:
    try:
        import av
    except ImportError:
        raise AudioError("audio needs PyAV: pip install -e '.[voice]' (make setup installs it)") from None
    return av


def decode(data: Bytes, rate: int = STT_RATE, max_s: float = MAX_AUDIO_S) -> Samples:
    """Samples (float32 numpy array in [-1, 1], mono, ``rate`` Hz) of an audio
    file's bytes in any format FFmpeg reads (WAV, Ogg Opus/Vorbis, FLAC, MP3,
    M4A, WebM...). Raises AudioError."""
    av = _av()
    limit = int(max_s * rate)
    chunks: list[npt.NDArray[np.int16]] = []
    count = 0
    try:
        with av.open(io.BytesIO(bytes(data)), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise AudioError("the file has no audio stream")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1)
                    count += len(chunk)
                    if count > limit:
                        raise AudioError(f"the audio is longer than {max_s:.0f} s")
                    chunks.append(chunk)
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
    except AudioError:
        raise
    except (av.error.FFmpegError, ValueError, IndexError) as e:
        raise AudioError(f"the audio could not be decoded: {e}") from None
    if not chunks:
        raise AudioError("the audio holds no samples")
    return np.concatenate(chunks).astype(np.float32) / 32768.0


def probe(data: Bytes, max_s: float = MAX_AUDIO_S) -> float:
    """Seconds of audio in a file's bytes, from its container (decoded whole only when the
    container does not say), after checking that its first frame decodes. Raises AudioError."""
    av = _av()
    seconds = None
    try:
        with av.open(io.BytesIO(bytes(data)), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise AudioError("the file has no audio stream")
            stream = container.streams.audio[0]
            if stream.duration and stream.time_base:
                seconds = float(stream.duration * stream.time_base)
            elif container.duration:
                seconds = container.duration / 1e6
            next(container.decode(audio=0))
    except StopIteration:
        raise AudioError("the audio holds no samples") from None
    except AudioError:
        raise
    except (av.error.FFmpegError, ValueError, IndexError) as e:
        raise AudioError(f"the audio could not be decoded: {e}") from None
    if seconds is None or seconds <= 0:
        return len(decode(data, max_s=max_s)) / STT_RATE
    if seconds > max_s:
        raise AudioError(f"the audio is longer than {max_s:.0f} s")
    return seconds


def pcm16(samples: npt.ArrayLike) -> bytes:
    """16-bit little-endian PCM bytes of float samples in [-1, 1]."""
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def from_pcm16(data: Bytes) -> Samples:
    """Float32 samples of 16-bit little-endian PCM bytes (an odd last byte is dropped)."""
    return np.frombuffer(bytes(data[:len(data) - len(data) % 2]), dtype="<i2").astype(np.float32) / 32768.0


def wav_header(rate: int, nbytes: int | None = None) -> bytes:
    """A 44-byte RIFF/WAVE header for mono 16-bit PCM; ``nbytes`` None writes
    0xFFFFFFFF sizes, as a stream whose length is not known yet does."""
    data = 0xFFFFFFFF if nbytes is None else nbytes
    riff = 0xFFFFFFFF if nbytes is None else 36 + nbytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data))


def wav(pcm: Bytes, rate: int) -> bytes:
    """A whole WAV file of 16-bit mono PCM bytes at ``rate`` Hz."""
    return wav_header(rate, len(pcm)) + bytes(pcm)


class OpusWriter:
    """Ogg Opus, encoded as samples come: ``write(pcm)`` takes 16-bit mono PCM
    at ``rate`` Hz and returns the Ogg bytes ready so far (FFmpeg's muxer
    closes a page about every second of audio), ``close()`` the rest."""

    def __init__(self, rate: int, bitrate: int = OPUS_BPS) -> None:
        av = _av()
        self.rate = rate
        self._buffer = io.BytesIO()
        self._container = av.open(self._buffer, mode="w", format="ogg")
        # libopus takes 8, 12, 16, 24 or 48 kHz: speech goes at 16 kHz (what speech to text uses).
        self._stream = self._container.add_stream("libopus", rate=STT_RATE, layout="mono")
        self._stream.bit_rate = int(bitrate)
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=STT_RATE)
        self._av = av

    def _take(self) -> bytes:
        data = self._buffer.getvalue()
        self._buffer.seek(0)
        self._buffer.truncate()
        return data

    def _mux(self, frame: object) -> None:
        for out in self._resampler.resample(frame):
            for packet in self._stream.encode(out):
                self._container.mux(packet)

    def write(self, pcm: Bytes) -> bytes:
        samples = np.frombuffer(bytes(pcm[:len(pcm) - len(pcm) % 2]), dtype="<i2")
        if len(samples):
            frame = self._av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = self.rate
            self._mux(frame)
        return self._take()

    def close(self) -> bytes:
        self._mux(None)
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._take()


def opus(samples: npt.ArrayLike, rate: int = STT_RATE, bitrate: int = OPUS_BPS) -> bytes:
    """A whole Ogg Opus file of float samples at ``rate`` Hz."""
    writer = OpusWriter(rate, bitrate)
    return writer.write(pcm16(samples)) + writer.close()


#: Formats PyAV encodes whole: (container, codec, bits/s or None).
ENCODED: dict[str, tuple[str, str, int | None]] = {
    "flac": ("flac", "flac", None), "mp3": ("mp3", "libmp3lame", 64000), "aac": ("adts", "aac", 64000)}


def _encode(pcm: Bytes, rate: int, fmt: str) -> bytes:
    """A whole file of 16-bit mono PCM bytes in ``fmt`` (a key of ENCODED), through PyAV."""
    av = _av()
    container_format, codec, bitrate = ENCODED[fmt]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        if bitrate:
            stream.bit_rate = bitrate
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=rate)
        samples = np.frombuffer(bytes(pcm[:len(pcm) - len(pcm) % 2]), dtype="<i2")
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        frames = resampler.resample(frame) + resampler.resample(None)
        for out in frames:
            for packet in stream.encode(out):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def convert(pcm: Bytes, rate: int, fmt: str, bitrate: int = OPUS_BPS) -> bytes:
    """16-bit mono PCM bytes at ``rate`` Hz as a file of ``fmt`` (FORMATS). Raises AudioError."""
    if fmt == "pcm":
        return bytes(pcm)
    if fmt == "wav":
        return wav(pcm, rate)
    if fmt == "opus":
        writer = OpusWriter(rate, bitrate)
        return writer.write(pcm) + writer.close()
    if fmt in ENCODED:
        try:
            return _encode(pcm, rate, fmt)
        except (_av().error.FFmpegError, ValueError) as e:
            raise AudioError(f"PyAV could not encode {fmt}: {e}") from None
    raise AudioError(f"unknown audio format {fmt!r}; formats: {', '.join(FORMATS)}")


def opus_bitrate(link_bps: float | None) -> int:
    """The Opus bitrate (bits/s) for a link of ``link_bps`` bits/s (None or 0: unknown, taken as fast)."""
    return OPUS_RADIO_BPS if link_bps and link_bps <= RADIO_LINK_BPS else OPUS_BPS


def for_link(data: Bytes, link_bps: float | None, seconds: float | None = None) -> tuple[bytes, str]:
    """(bytes to send, what they are) for an audio file's bytes on a link of
    ``link_bps`` bits/s: the file itself when it is no more than KEEP_RATIO
    times Opus at the link's bitrate (already compressed), else Ogg Opus at
    that bitrate ("opus"). ``seconds``: its length, if the caller knows it
    (probe). Raises AudioError."""
    seconds = probe(data) if seconds is None else seconds
    bitrate = opus_bitrate(link_bps)
    if len(data) * 8 <= KEEP_RATIO * bitrate * max(seconds, 1.0):
        return bytes(data), "original"
    return opus(decode(data), bitrate=bitrate), "opus"
