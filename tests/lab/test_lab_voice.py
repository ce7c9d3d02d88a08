"""A voice note over a LoRa-class link (lora-fast: 5.5 kbit/s, 250 ms, 1 % loss, 500-byte MTU,
half duplex) in the network lab: the client sends it as 12 kbit/s Opus and the transcript comes
back right. Skipped, with the reason, where namespaces cannot be made."""

import json

from testbed.lab.topology import Lab
from testbed.lab.voice_run import NOTE
from testbed.requirements import needs
from testbed.voice_support import VOICE, wer

pytestmark = [needs("netns", "the network lab's hosts are network namespaces"),
              needs("espeak-ng", "the note is spoken by espeak-ng"),
              needs("faster-whisper", "speech to text runs on faster-whisper")]


def voice_run(lab, timeout=600):
    """testbed/lab/voice_run.py in the lab's client namespace; its JSON result."""
    returncode, out, err = lab.run_client("testbed.lab.voice_run", timeout=timeout)
    assert returncode == 0 and out.strip(), err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_voice_note_over_lora_fast(tmp_path):
    lab = Lab(tmp_path, "lora-fast")
    try:
        lab.start_tower(models={}, roles=("voice",), voice=VOICE)
        result = voice_run(lab)
    finally:
        lab.close()
    print(f"lora-fast voice note: {result}")
    assert "error" not in result, result
    assert wer(NOTE, result["text"]) <= 0.2
    assert result["sent_as"] == "opus" and result["sent_bytes"] <= 12000 / 8 * result["audio_s"] * 1.4
    assert sum(result["wire_bytes"]) < 3 * result["sent_bytes"], "the note crossed the air about once"
