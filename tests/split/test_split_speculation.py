"""Speculative decoding across a split (split/speculation.py): a draft on the
coordinator proposes as many tokens as the link's round trip makes worth
checking at once. Against a real llama-server --rpc over a real
ggml-rpc-server on loopback, and real towers on two hosts of the network lab
joined by a tailnet-shaped link, with the same weights as draft (every
draft holds)."""

import re
import sys
import threading

import pytest

from reticulum_grid.inference.generation import Generation
from reticulum_grid.inference.request import parse
from reticulum_grid.split import speculation
from reticulum_grid.split.rpcworker import RpcWorker
from reticulum_grid.split.supervisor import SplitModel
from testbed.requirements import needs
from testbed.tiny_models import renamed_copy

#: llama-server's report of a request's drafts (tools/server/server-context.cpp, print_timing).
DRAFTS = re.compile(r"draft acceptance = [0-9.]+ \(\s*(\d+) accepted /\s*(\d+) generated\), mean len =\s*([0-9.]+)")

SMOLLM_BYTES = 98_362_432  # the bundled SmolLM2-135M Q4_1


def test_the_draft_runs_further_ahead_the_longer_the_round_trip():
    cpu = 10e9  # estimate.PRIOR_BANDWIDTH["cpu"]
    assert speculation.draft_max(0.0, SMOLLM_BYTES, cpu) == speculation.MIN_DRAFT == 3
    assert speculation.draft_max(0.0007, SMOLLM_BYTES, cpu) == 3  # loopback: llama.cpp's own length
    lan, tailnet = speculation.draft_max(0.02, SMOLLM_BYTES, cpu), speculation.draft_max(0.044, SMOLLM_BYTES, cpu)
    assert 3 < lan < tailnet == 11  # 2.4 round trips x 44 ms over 9.8 ms a drafted token
    assert speculation.draft_max(0.3, SMOLLM_BYTES, cpu) == speculation.MAX_DRAFT
    assert speculation.draft_max(0.044, SMOLLM_BYTES, 500e9) == speculation.MAX_DRAFT  # a GPU drafts for free


def test_the_ceiling_of_a_draft_is_every_drafted_token_accepted():
    cpu, split = 10e9, 8.6  # the 135M's split over the lab's tailnet, estimated (docs/split.md)
    ahead, most = speculation.ceiling(split, 0.044, SMOLLM_BYTES, cpu)
    assert ahead == 11  # as the coordinator chooses (draft_max)
    # 11 drafted tokens (9.8 ms each) and one split pass (1 / 8.6 s) give 12 tokens.
    assert most == pytest.approx(12 / (11 * SMOLLM_BYTES / cpu + 1 / split))
    assert 2 < most / split < 12
    # Nearby, a round trip costs little: a short draft; a draft slower than the model loses.
    near, slow = speculation.ceiling(50.0, 0.0005, SMOLLM_BYTES, cpu), speculation.ceiling(10.0, 0.0, 2 * 10**9, cpu)
    assert near[0] == speculation.MIN_DRAFT and slow[1] < 10.0


@pytest.fixture
def worker(tmp_path):
    made = RpcWorker(tmp_path / "rpc.log", threads=1, private=False)
    yield made.endpoint()
    made.stop()


@needs("llama-rpc", "split inference rides on llama.cpp's RPC backend")
def test_one_verification_across_the_split_checks_a_long_draft(model_path, worker, tmp_path):
    draft = renamed_copy(model_path, tmp_path / "draft.gguf")
    log = tmp_path / "split.log"
    model = SplitModel("k", model_path, 512, [worker], [15, 15], log, threads=1, draft=str(draft),
                       draft_max=12).start(timeout=120)
    try:
        request = parse({"model": "m", "prompt": "Count from 1 to 500: 1, 2,", "max_tokens": 64,
                         "temperature": 0.0, "stream_id": 1})
        result = Generation()
        text = b"".join(p.data for p in model.generate(request, threading.Event(), result))
    finally:
        model.close()
    assert text.startswith(b" 3, 4, 5") and result.completion_tokens == 64
    assert result.draft_tokens > 0 and result.draft_accepted > 0, result
    accepted, generated, mean_len = DRAFTS.findall(log.read_text())[-1]
    assert (int(accepted), int(generated)) == (result.draft_accepted, result.draft_tokens)
    # Tokens per verification (1 + accepted / verifications): llama.cpp's default draft of 3 makes at most 4.
    assert float(mean_len) > 6, mean_len


#: One split request from the client's host: the plan the client makes, then the stream (as bench/split.py does).
CLIENT = """
import sys
from reticulum_grid.client import Grid, Usage
from reticulum_grid.client.split import SplitStream, make_plan
grid = Grid(home=sys.argv[1], rns_config=sys.argv[2])
grid.wait_for(lambda entries: len(entries) >= 3, 120)
grid.caps_full(grid.towers(), timeout=60)
placement, entries = make_plan(grid, "lab-split")
payload = {"model": "lab-split", "prompt": "Count from 1 to 500: 1, 2,", "max_tokens": 48, "temperature": 0.0}
usage = [p for p in SplitStream(grid, payload, placement, entries) if isinstance(p, Usage)][-1]
print(usage.completion_tokens, usage.draft_tokens, usage.draft_accepted)
"""


@needs("netns", "the coordinator and the worker sit on two hosts joined by a shaped link")
def test_a_coordinator_drafts_further_across_a_tailnet(model_path, tmp_path):
    from testbed.lab.splitlab import SplitLab
    lab = SplitLab(tmp_path / "lab", "tailnet", model_path, lend_mib=400,
                   draft=renamed_copy(model_path, tmp_path / "draft.gguf"))
    try:
        done = lab.run([sys.executable, "-c", CLIENT, str(lab.client_home), str(lab.client_rns)], timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        completion, drafted, accepted = map(int, done.stdout.split())
        coord_log = lab.towers["coord"].log()
        split_log = (lab.towers["coord"].dir / "split-model.log").read_text()
    finally:
        lab.close()
    assert completion == 48 and accepted > 0 and drafted > 0
    # The coordinator's ping to the worker crossed the tailnet's ~44 ms: the draft runs further than llama.cpp's 3.
    chosen = int(re.search(r"split draft: up to (\d+) tokens a verification", coord_log).group(1))
    assert chosen > speculation.MIN_DRAFT
    assert re.search(rf"n_max={chosen}, n_min=0", split_log)
    assert float(DRAFTS.findall(split_log)[-1][2]) > speculation.MIN_DRAFT + 1  # tokens per verification
