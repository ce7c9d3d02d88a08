"""``rngrid transcribe`` and ``rngrid say``: voice on the grid from the command line."""

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from links.wire import Code, WireError
from reticulum_grid.cli.common import client_options, err, json_line, main, open_grid, out, reported_errors, visible

T = TypeVar("T")

BUSY = click.option("--busy-wait", default=60.0, show_default=True, type=click.FloatRange(0),
                    help="Seconds to keep retrying while every voice tower is busy.")
TOWER = click.option("--tower", default=None, help="Run on this tower (name or destination hash) instead of routing.")


def _retrying(run: Callable[[], T], busy_wait: float) -> T:
    """``run()``, again while every tower is busy (busy comes before any output) for up to ``busy_wait`` s."""
    deadline = time.monotonic() + busy_wait
    while True:
        try:
            return run()
        except WireError as e:
            pause = max(1.0, e.retry_after or 0.0)
            if e.code != Code.BUSY or time.monotonic() + pause > deadline:
                raise
            err.print(f"{e.message}; trying again in {pause:.0f} s")
            time.sleep(pause)


@main.command()
@client_options
@click.option("-m", "--model", default=None, help="Speech-to-text engine alias (default: any, e.g. whisper-base).")
@click.option("--language", default=None, help="ISO 639-1 code of the speech (default: detected).")
@click.option("--prompt", default=None, help="Words to expect (names, terms).")
@TOWER
@BUSY
@click.option("--force", is_flag=True, help="Send the audio over a radio link however long it takes.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON lines: {\"segment\": {start_s, end_s, text}} each, then {\"end\": ...}.")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.pass_context
def transcribe(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, model: str | None,
               language: str | None, prompt: str | None, tower: str | None, busy_wait: float, force: bool,
               as_json: bool, file: str) -> None:
    """Transcribe the audio FILE (WAV, Ogg, FLAC, MP3, M4A, ...; "-" reads standard input) on the grid,
    printing each segment as it is decoded."""
    from reticulum_grid.voice.request import Segment
    data = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    grid = open_grid(ctx, connect, rns_config)

    def run() -> None:
        stream = grid.transcribe(data, model=model, language=language, prompt=prompt, tower=tower, force=force)
        for item in stream:
            if isinstance(item, Segment):
                if as_json:
                    json_line({"segment": {"start_s": item.start_s, "end_s": item.end_s, "text": item.text}})
                else:
                    out.print(f"[{item.start_s:7.2f} -> {item.end_s:7.2f}] {visible(item.text)}")
            elif item is None:  # never: a stream's last item is the end its attempt read
                continue
            elif as_json:
                json_line({"end": {**item.to_map(), "failovers": stream.failovers, "sent_bytes": stream.sent_bytes,
                                   "sent_as": stream.sent_as}})
            else:
                err.print(f"{item.audio_s:.1f} s of {item.language or '?'} speech from {item.tower} ({item.model}), "
                          f"{item.realtime:.1f}x real time; sent {stream.sent_bytes} bytes ({stream.sent_as})",
                          style="dim")

    with reported_errors():
        _retrying(run, busy_wait)


@main.command()
@client_options
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Write the audio here; its format follows the suffix (.wav, .ogg/.opus, .flac, .mp3, .aac, .pcm).")
@click.option("-m", "--model", default=None, help="Text-to-speech engine alias (default: any, e.g. espeak-ng).")
@click.option("--voice", default=None, help="Voice (espeak-ng language, e.g. en-us, en-gb, de, fr).")
@click.option("--wpm", default=None, type=click.IntRange(80, 450), help="Words per minute.")
@TOWER
@BUSY
@click.option("--json", "as_json", is_flag=True, help="Print the end figures as JSON.")
@click.argument("text")
@click.pass_context
def say(ctx: click.Context, connect: tuple[str, ...], rns_config: str | None, output: str, model: str | None,
        voice: str | None, wpm: int | None, tower: str | None, busy_wait: float, as_json: bool, text: str) -> None:
    """Speak TEXT on the grid into a file ("-" reads the text from standard input)."""
    if text == "-":
        text = sys.stdin.read()
    suffix = Path(output).suffix.lower().lstrip(".")
    fmt = {"ogg": "opus", "opus": "opus", "flac": "flac", "pcm": "pcm", "raw": "pcm", "mp3": "mp3",
           "aac": "aac"}.get(suffix, "wav")
    grid = open_grid(ctx, connect, rns_config)
    with reported_errors():
        speech = _retrying(lambda: grid.speak(text, model=model, voice_name=voice, wpm=wpm, fmt=fmt, tower=tower),
                           busy_wait)
    speech.save(output)
    end = speech.end
    if as_json:
        json_line({"end": {**end.to_map(), "output": output, "bytes": len(speech.data), "format": fmt,
                           "received_bytes": speech.received_bytes, "received_as": speech.received_as}})
    else:
        err.print(f"{end.audio_s:.1f} s of speech ({end.voice}) from {end.tower}, {end.realtime:.0f}x real time: "
                  f"{output} ({len(speech.data)} bytes, {fmt}); received {speech.received_bytes} bytes "
                  f"({speech.received_as})", style="dim")
