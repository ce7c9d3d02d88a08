"""One voice note transcribed from inside the lab's client namespace, measured: the note
(espeak-ng speaks ``--text`` at 150 words/min, as a WAV), the time from the request to the
transcript's end, the audio bytes sent (and as what) and the bytes every hop carried for it,
both ways (the relays' counters). Prints one JSON object.

Run: ``python -m testbed.lab.voice_run --home H --rns-config D --stats HOP0.json ...``.
"""

import json
import logging
import time

from reticulum_grid.client import Grid
from testbed.lab.client_run import SETTLE_S, client_parser, wire_bytes
from testbed.voice_support import spoken

NOTE = "Please send the weather report to the base camp before noon, the river is high."


def main():
    p = client_parser(discover_timeout=180.0)
    p.add_argument("--text", default=NOTE)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    note = spoken(a.text)
    grid = Grid(home=a.home, rns_config=a.rns_config)
    result = {"note_bytes": len(note)}
    try:
        started = time.monotonic()
        entry = grid.wait_for(lambda _: (e := grid.table.find(a.tower)) and e.caps.voices("stt") and e,
                              a.discover_timeout)
        result["discovery_s"] = round(time.monotonic() - started, 3)
        if not entry:
            result["error"] = f"{a.tower} with a speech-to-text engine not heard within {a.discover_timeout:.0f} s"
            return result
        grid.connection(entry).ensure_link(60)  # the Link's set-up is not the note's time
        time.sleep(SETTLE_S)
        before = wire_bytes(a.stats)
        start = time.monotonic()
        stream = grid.transcribe(note, tower=a.tower)
        transcript = stream.transcript()
        result["elapsed_s"] = round(time.monotonic() - start, 3)
        time.sleep(SETTLE_S)
        result.update(text=transcript.text, audio_s=transcript.end.audio_s, sent_bytes=transcript.sent_bytes,
                      sent_as=transcript.sent_as, tower_work_s=transcript.end.work_s,
                      wire_bytes=[x - b for x, b in zip(wire_bytes(a.stats), before)])
    finally:
        print(json.dumps(result), flush=True)
        grid.close()


if __name__ == "__main__":
    main()
