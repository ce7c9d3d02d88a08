"""Voice on the grid against faster-whisper run here, and a voice note over a LoRa-class link.

1. Real-time factor (seconds of audio per second, as the caller waits): the same espeak-ng
   recording (~31 s, two of Whisper's 30 s windows, as a 32 kbit/s Opus file) transcribed by faster-whisper in this
   process (decode + transcribe, the bundled Whisper base, the same CPU threads as the tower's)
   and through a tower on loopback RNS (Opus encoding, the Link, the tower's decode and
   transcription, the segments streamed back), in alternating pairs after a warm-up of each.
   Also printed: the seconds the grid adds beyond the tower's own transcription time, and that
   time's share of the grid's (what the ratio is on a machine nothing else loads: on shared
   cores the transcriptions' own times swing by 2x from run to run).
   Last line: ``voice_rtf_ratio=<grid / local>`` (the median of the per-pair ratios; goal >= 0.95).
2. ``--lab``: a ~5 s voice note over ``lora-fast`` (testbed/lab/: its own network namespaces;
   needs root): time from the request to the transcript, Opus bytes sent, bytes on air both ways.

Run: ``python -m bench.voice [--pairs 3] [--threads 1] [--lab]``.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import spread
from reticulum_grid.client import Grid
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers
from reticulum_grid.voice import audio, models
from reticulum_grid.voice.stt import SpeechToText, TranscriptInfo
from testbed.requirements import bench_needs
from testbed.voice_support import TOWERS, spoken, wait_voice

TEXT = " ".join(TOWERS[:6])  # ~30 s spoken


class _Hub:
    """What testbed.voice_support.wait_voice needs of a test hub."""

    def __init__(self, grid):
        self.grid = grid


def local_run(engine, data):
    """(audio seconds, wall seconds, text) of ``data`` decoded and transcribed here."""
    started = time.perf_counter()
    samples = audio.decode(data)
    info = TranscriptInfo()
    text = " ".join(s.text for s in engine.transcribe(samples, info))
    return info.audio_s, time.perf_counter() - started, text


def grid_run(grid, data):
    """(audio seconds, wall seconds, text, the tower's own seconds of transcription)."""
    started = time.perf_counter()
    transcript = grid.transcribe(data, tower="bench-voice").transcript()
    return transcript.end.audio_s, time.perf_counter() - started, transcript.text, transcript.end.work_s


def rtf(args):
    # One file for both sides: Opus at the bitrate a fast link gets, so the grid sends it as it
    # is (audio.for_link) and both transcribe the very same samples.
    data = audio.opus(audio.decode(spoken(TEXT)), bitrate=audio.OPUS_BPS)
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-voice-") as tmp:
        home = Path(tmp) / "client"
        client_id = identity.load_or_create(home / "identity").hash.hex()
        trust_local_towers(home)
        voice = {"whisper-base": {"kind": "stt", "threads": args.threads}, "espeak-ng": {"kind": "tts"}}
        tower = TowerProcess(tmp, "bench-voice", {}, allow={client_id: ["voice"]}, voice=voice).start()
        try:
            grid = Grid(home=home, connect=[tower.address])
            wait_voice(_Hub(grid), "bench-voice", kinds=("stt",), timeout=180)
            engine = SpeechToText("local", models.install(), threads=args.threads)
            local_run(engine, data), grid_run(grid, data)  # warm up both
            local, remote = [], []
            for k in range(args.pairs):
                order = (local_run, grid_run) if k % 2 == 0 else (grid_run, local_run)
                for run in order:
                    result = run(engine, data) if run is local_run else run(grid, data)
                    (local if run is local_run else remote).append(result)
            grid.close()
        finally:
            rnsnet.stop()
            tower.stop()
    local_x = [a / w for a, w, _ in local]
    grid_x = [a / w for a, w, _, _ in remote]
    ratios = [g / lo for g, lo in zip(grid_x, local_x)]
    # What the grid adds (wall time beyond the tower's own transcription: encoding, the Link, the
    # tower's decode and queue, the stream back) does not move with the machine's other load as
    # the transcription itself does: its share is the ratio a quiet machine would show.
    added = [w - work for _, w, _, work in remote]
    share = [work / w for _, w, _, work in remote]
    print(f"audio: {local[0][0]:.1f} s of espeak-ng speech, Whisper base, {args.threads} thread(s) each side")
    print(f"local faster-whisper: {spread(local_x)} x real time")
    print(f"through the grid:     {spread(grid_x)} x real time")
    print(f"same text both ways: {sum(g[2] == lo[2] for g, lo in zip(remote, local))} of {len(local)}")
    print(f"added by the grid: {spread(added)} s per request; transcription's share of the grid's time: "
          f"{statistics.median(share):.3f}")
    print(f"voice_rtf_ratio={statistics.median(ratios):.3f}", flush=True)


def lab():
    bench_needs("netns", "bench.voice --lab")
    from testbed.lab.topology import Lab
    from testbed.voice_support import VOICE
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-voice-lab-") as tmp:
        lab = Lab(Path(tmp), "lora-fast")
        try:
            lab.start_tower(models={}, roles=("voice",), voice=VOICE)
            _, out, err = lab.run_client("testbed.lab.voice_run", timeout=600)
        finally:
            lab.close()
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err.strip()[-500:]}
    print(json.dumps({"path": "lora-fast", **result}), flush=True)
    if "error" not in result:
        print(f"lora-fast voice note: {result['audio_s']:.1f} s of speech in {result['elapsed_s']:.1f} s, "
              f"{result['sent_bytes']} bytes of {result['sent_as']} sent, {sum(result['wire_bytes'])} bytes on air "
              f"(both ways); heard {result['text']!r}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lab", action="store_true", help="also the voice note over lora-fast (root)")
    args = p.parse_args()
    bench_needs("espeak-ng", "bench.voice")
    bench_needs("faster-whisper", "bench.voice")
    rtf(args)
    if args.lab:
        lab()


if __name__ == "__main__":
    main()
