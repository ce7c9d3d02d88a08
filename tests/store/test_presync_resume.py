"""A dispatch whose pre-sync is cut resumes it: the model a request needs is
pulled to the chosen tower before it runs; when that tower dies half-way, the
next dispatch there fetches only the chunks it lacks, then answers.

Tower presync-dst lacks the model and reaches presync-src (which holds it)
only through the lab's shaping relay (a few MB/s), so the pull lasts long
enough to kill presync-dst half-way."""

import re

import pytest

from links.wire import WireError
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import default_model_path
from tests.store.blob_towers import behind_a_relay, restart, verified_chunks

MODEL = "presync-model"
RATE_BPS = 40_000_000  # 5 MB/s from src to dst: ~19 s for the bundled model
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"
#: The tower's record of a finished transfer (tower/blobs.py).
TRANSFER = re.compile(r"transfer \d+: [0-9a-f]+ complete, (\d+) chunk\(s\), (\d+) already here")


@pytest.fixture(scope="module")
def towers(hub):
    with behind_a_relay(hub, "presync-src", "presync-dst", RATE_BPS, ("infer", "sync"),
                        models={MODEL: default_model_path()}) as pair:
        yield pair


def test_a_cut_pre_sync_resumes_and_the_request_then_runs(hub, towers, reference):
    target, _ = towers
    seen = []

    def progress(done, total):
        seen.append((done, total))
        if done >= total * 0.3 and target.proc.poll() is None:
            target.kill()  # SIGKILL mid-pull: no chance to tidy up

    payload = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0}
    with pytest.raises(WireError):
        list(hub.grid.execute("ai/inference", payload, tower=target.name, progress=progress))
    assert target.proc.poll() is not None, f"the pre-sync ended before the kill (progress {seen[-3:]})"
    kept = verified_chunks(target)
    assert kept > 0, "a have-map with some chunks stays on disk"

    restart(hub, target)
    pieces = list(hub.grid.execute("ai/inference", payload, tower=target.name))
    assert isinstance(pieces[-1], Usage) and pieces[-1].tower == target.name
    assert "".join(pieces[:-1]) == reference.completion(PROMPT, 8), "the synced model answers as the original"
    (chunks, reused), = TRANSFER.findall(target.log())
    assert int(reused) >= kept and int(reused) < int(chunks), (chunks, reused, kept)
