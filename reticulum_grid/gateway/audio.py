"""OpenAI's audio API on the grid: ``POST /v1/audio/transcriptions`` and ``POST /v1/audio/speech``.

``/v1/audio/transcriptions`` takes OpenAI's multipart form: ``file`` (any
format FFmpeg reads), ``model`` (a speech-to-text engine alias, or one of
OpenAI's names, which mean any engine), ``language``, ``prompt``,
``response_format`` (``json`` {text}, ``text``, ``verbose_json`` {task,
language, duration, text, segments: [{id, start, end, text}]}, ``srt``,
``vtt``) and ``stream`` (true: SSE events ``transcript.text.delta`` per
segment, then ``transcript.text.done``). The transcription runs through the
Grid (client/voice.py: routing, failover, audio compressed for the link).

``/v1/audio/speech`` takes JSON {model, input, voice, response_format (wav,
pcm, opus, flac, mp3, aac; OpenAI's default is mp3), speed (0.25..4)}: a
voice that is one of OpenAI's names means the engine's default voice, any
other is an espeak-ng voice ("en-gb", "de", ...).

While every tower is busy a request is tried again as their retry hints say,
for up to the gateway's ``busy_wait_s``, then answered 429. The body limit
is the gateway's (intake.MAX_BODY_BYTES, 4 MiB): minutes of compressed
speech, about two of 16 kHz WAV.
"""

import json
import types
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, TypeVar

from sse_starlette.sse import EventSourceResponse
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from links.wire import Code, WireError
from reticulum_grid.client import Grid
from reticulum_grid.client.busy import BusyWait
from reticulum_grid.client.voice import Speech
from reticulum_grid.gateway.bridge import Call, Reporter, Stopped, Work
from reticulum_grid.gateway.errors import ApiError, bad_request
from reticulum_grid.gateway.http import endpoint, json_body
from reticulum_grid.gateway.inference import Event
from reticulum_grid.gateway.parts import GatewayParts
from reticulum_grid.voice.audio import FORMATS, MIME
from reticulum_grid.voice.request import Segment, TranscriptEnd
from reticulum_grid.voice.tts import DEFAULT_WPM, WPM_RANGE

#: OpenAI's model names: any engine of the kind will do.
OPENAI_STT = {"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"}
OPENAI_TTS = {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"}
#: OpenAI's voice names: the engine's default voice.
OPENAI_VOICES = {"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse"}
RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
#: What a transcript stream yields: segments, then its end (None only if a tower's stream gave none).
Heard = Segment | TranscriptEnd | None
T = TypeVar("T")
E = TypeVar("E")


def routes(gateway: GatewayParts) -> list[Route]:
    """The audio routes of ``gateway`` (app.Gateway), with its API key check and OpenAI's errors."""
    wrap = endpoint("openai")
    # Bound as methods: Starlette calls a function or a method with the request alone.
    return [Route("/v1/audio/transcriptions", types.MethodType(wrap(transcriptions), gateway), methods=["POST"]),
            Route("/v1/audio/speech", types.MethodType(wrap(speech), gateway), methods=["POST"])]


def _busy_retry(grid: Grid, call: Reporter[E], busy_wait_s: float, run: Callable[[], T], model: str | None) -> T:
    """``run()``, tried again while every tower is busy (busy comes before any
    output), waiting as every client does (client/busy.py)."""
    wait = BusyWait(grid, busy_wait_s)
    call.on_stop(wait.stop)
    while True:
        try:
            return run()
        except WireError as e:
            if e.code != Code.BUSY or not wait.wait(model or "", e):
                raise


def _model(value: object, openai_names: set[str]) -> str | None:
    """The engine alias asked for; None for any engine."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise bad_request("'model' must be a string", "model")
    return None if value in openai_names else value


def _end(item: Heard) -> TranscriptEnd:
    """The transcript's end. Raises RuntimeError for none (the Grid's stream ends with one)."""
    if not isinstance(item, TranscriptEnd):
        raise RuntimeError("a transcript stream ended without its end")
    return item


def _form_text(form: FormData, name: str) -> str | None:
    """A form's text field (None when absent). Raises ApiError(400) for a file sent under its name."""
    value = form.get(name)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"'{name}' must be a text field, not a file", name)
    return value


async def transcriptions(gateway: GatewayParts, request: Request) -> Response:
    try:
        form = await request.form()
    except Exception as e:  # not multipart, or a broken one
        raise bad_request(f"send multipart/form-data with a 'file' field: {e}", "file") from None
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise bad_request("the form needs a 'file' (the audio)", "file")
    data = await upload.read()
    fmt = _form_text(form, "response_format") or "json"
    if fmt not in RESPONSE_FORMATS:
        raise bad_request(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}", "response_format")
    model = _model(form.get("model"), OPENAI_STT)
    language, prompt = _form_text(form, "language") or None, _form_text(form, "prompt") or None
    stream = str(form.get("stream", "false")).lower() == "true"

    def work(call: Reporter[Heard]) -> None:
        def run() -> None:
            transcript = gateway.grid.transcribe(data, model=model, language=language, prompt=prompt)
            for item in transcript:
                if call.stopped.is_set():
                    return  # leaving the stream cancels the work on the tower
                call.emit(item)
        _busy_retry(gateway.grid, call, gateway.busy_wait_s, run, model)

    events = Call(work, name="rngrid-gateway-transcribe").events(request.scope["rngrid.gone"])
    first = await _first(events)  # errors before any segment keep their HTTP status
    if stream:
        return EventSourceResponse(_deltas(first, events))
    items = [first] + [item async for item in events]
    segments = [item for item in items[:-1] if isinstance(item, Segment)]
    return _transcript_response(fmt, segments, _end(items[-1]))


async def _deltas(first: Heard, events: AsyncGenerator[Heard, None]) -> AsyncGenerator[dict[str, str], None]:
    text: list[str] = []
    item = first
    try:
        while isinstance(item, Segment):
            delta = (" " if text else "") + item.text
            text.append(item.text)
            yield {"data": json.dumps({"type": "transcript.text.delta", "delta": delta})}
            item = await anext(events)
        yield {"data": json.dumps({"type": "transcript.text.done", "text": " ".join(text),
                                   "rngrid": _end(item).to_map()})}
    except Exception as e:
        error = e if isinstance(e, ApiError) else ApiError.from_wire(e) if isinstance(e, WireError) else \
            ApiError(500, "internal error in the gateway (see its log)", code=Code.INTERNAL)
        yield {"event": "error", "data": json.dumps(error.body())}
    finally:
        await events.aclose()


def _transcript_response(fmt: str, segments: Sequence[Segment], end: TranscriptEnd) -> Response:
    text = " ".join(s.text for s in segments if s.text).strip()
    if fmt == "text":
        return PlainTextResponse(text + "\n")
    if fmt in ("srt", "vtt"):
        return PlainTextResponse(_subtitles(segments, fmt), media_type="text/vtt" if fmt == "vtt" else "text/plain")
    if fmt == "json":
        return JSONResponse({"text": text, "rngrid": end.to_map()})
    return JSONResponse({"task": "transcribe", "language": end.language, "duration": end.audio_s, "text": text,
                         "segments": [{"id": i, "start": s.start_s, "end": s.end_s, "text": s.text}
                                      for i, s in enumerate(segments)], "rngrid": end.to_map()})


def _subtitles(segments: Sequence[Segment], fmt: str) -> str:
    def stamp(seconds: float) -> str:
        ms = int(round(seconds * 1000))
        sep = "," if fmt == "srt" else "."
        return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"
    blocks = [f"{i + 1}\n{stamp(s.start_s)} --> {stamp(s.end_s)}\n{s.text}\n" for i, s in enumerate(segments)]
    return ("WEBVTT\n\n" if fmt == "vtt" else "") + "\n".join(blocks)


async def speech(gateway: GatewayParts, request: Request) -> Response:
    body = await json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("input"), str) or not body["input"].strip():
        raise bad_request("the body needs 'input': the text to speak", "input")
    fmt = body.get("response_format") or "mp3"
    if fmt not in FORMATS:
        raise bad_request(f"response_format must be one of {', '.join(FORMATS)}", "response_format")
    voice = body.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise bad_request("'voice' must be a string", "voice")
    speed = body.get("speed", 1.0)
    if not isinstance(speed, (int, float)) or isinstance(speed, bool) or not 0.25 <= speed <= 4.0:
        raise bad_request("'speed' must be a number from 0.25 to 4", "speed")
    wpm = min(max(int(round(DEFAULT_WPM * speed)), WPM_RANGE[0]), WPM_RANGE[1])
    model = _model(body.get("model"), OPENAI_TTS)
    voice_name = None if voice in OPENAI_VOICES else voice

    def work(call: Reporter[Speech]) -> None:
        call.emit(_busy_retry(gateway.grid, call, gateway.busy_wait_s, lambda: gateway.grid.speak(
            body["input"], model=model, voice_name=voice_name, wpm=wpm, fmt=fmt), model))

    events = Call(work, name="rngrid-gateway-speech").events(request.scope["rngrid.gone"])
    spoken = await _first(events)
    await events.aclose()
    return Response(spoken.data, media_type=MIME[fmt], headers={"X-Rngrid-Audio-Seconds": f"{spoken.end.audio_s:.3f}"})


async def _first(events: AsyncGenerator[T, None]) -> T:
    try:
        return await anext(events)
    except StopAsyncIteration:  # the work ended without a word: only when its client left
        raise Stopped() from None


# -- the same through POST /v1/grid/execute (commands.py) -----------------------------
COMMANDS = ("audio/transcribe", "audio/speech")


def command_work(grid: Grid, command: str, params: dict[str, Any], busy_wait_s: float) -> Work[Event]:
    """``work(call)`` for ``audio/transcribe`` (params: ``audio``, the file as
    base64; ``model``, ``language``, ``prompt``, ``tower``): events ``segment``
    {start_s, end_s, text} ..., then ``transcript`` {text, language, audio_s,
    realtime, tower, ...}; or ``audio/speech`` (params: ``text``, ``model``,
    ``voice``, ``wpm``, ``format``, ``tower``): one ``audio`` {format, data:
    base64}, then ``speech`` {audio_s, sample_rate, tower, ...}. Raises
    ApiError(400) for bad params."""
    import base64
    import binascii

    tower = params.get("tower")
    if command == "audio/transcribe":
        try:
            data = base64.b64decode(params.get("audio") or "", validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise bad_request("audio/transcribe needs params.audio: the audio file as base64", "params.audio") from None
        if not data:
            raise bad_request("audio/transcribe needs params.audio: the audio file as base64", "params.audio")
        model, language, prompt = params.get("model"), params.get("language"), params.get("prompt")

        def transcribe(call: Reporter[Event]) -> None:
            def run() -> None:
                stream = grid.transcribe(data, model, language, prompt, tower=tower)
                for item in stream:
                    if call.stopped.is_set():
                        return
                    if isinstance(item, Segment):
                        call.emit({"type": "segment", "start_s": item.start_s, "end_s": item.end_s, "text": item.text})
                    else:
                        call.emit({"type": "transcript", "text": " ".join(s.text for s in stream.segments if s.text),
                                   **_end(item).to_map(), "failovers": stream.failovers})
            _busy_retry(grid, call, busy_wait_s, run, model)
        return transcribe
    if not isinstance(params.get("text"), str):
        raise bad_request("audio/speech needs params.text", "params.text")
    fmt = params.get("format") or "wav"
    if fmt not in FORMATS:
        raise bad_request(f"params.format must be one of {', '.join(FORMATS)}", "params.format")

    def speak(call: Reporter[Event]) -> None:
        spoken = _busy_retry(grid, call, busy_wait_s, lambda: grid.speak(
            params["text"], params.get("model"), params.get("voice"), params.get("wpm"), fmt, tower=tower),
            params.get("model"))
        call.emit({"type": "audio", "format": fmt, "data": base64.b64encode(spoken.data).decode("ascii")})
        call.emit({"type": "speech", **spoken.end.to_map()})
    return speak
