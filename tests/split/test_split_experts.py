"""Expert placement (split/experts.py) and the supervised split model
(split/supervisor.py) against real llama.cpp RPC servers, without towers:
a tiny mixture-of-experts GGUF written here with the gguf library (random
weights, the real tokenizer of the bundled model) runs with its expert
tensors on an RPC worker and must give the same text as one process."""

import threading

import pytest

from links.wire import WireError
from reticulum_grid.inference.generation import Generation
from reticulum_grid.inference.request import parse
from reticulum_grid.node import childguard
from reticulum_grid.split import experts
from reticulum_grid.split.rpcworker import RpcWorker
from reticulum_grid.split.supervisor import SplitModel
from tests.reference import Reference
from testbed.tiny_models import write_tiny
from testbed.requirements import needs

pytestmark = needs("llama-rpc", "split inference rides on llama.cpp's RPC backend")

LAYERS, DIM, FF, HEADS, EXPERTS = 4, 64, 128, 4, 4
PROMPT = "The lighthouse keeper"


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory, model_path):
    path = tmp_path_factory.mktemp("moe") / "tiny-moe.gguf"
    write_tiny(path, model_path, LAYERS, DIM, FF, HEADS, experts=EXPERTS)
    return path


@pytest.fixture
def workers(tmp_path):
    made = []

    def start(count):
        for i in range(count):
            made.append(RpcWorker(tmp_path / f"rpc{i}.log", threads=1, private=False))
        return [w.endpoint() for w in made]

    start.made = made

    yield start
    for worker in made:
        worker.stop()


def single(path, max_tokens, tmp_path):
    """The text one process gives, with the split runner's settings (one slot, 512 tokens, one thread)."""
    reference = Reference(path, tmp_path / "single.log", n_ctx=512, parallel=1, threads=1)
    try:
        return reference.completion(PROMPT, max_tokens).encode("utf-8")
    finally:
        reference.close()


def rpc_server_pid(worker):
    return childguard.program_pid(worker.guard)


def split(path, endpoints, counts, tmp_path, experts_on_workers, max_tokens):
    model = SplitModel("k", path, 512, endpoints, counts, tmp_path / "split.log", threads=1,
                       strategy="experts" if experts_on_workers else "pipeline").start(timeout=120)
    try:
        request = parse({"model": "m", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0, "stream_id": 1})
        result = Generation()
        text = b"".join(p.data for p in model.generate(request, threading.Event(), result))
        return text, result, model.weights_mib
    finally:
        model.close()


def test_tiny_moe_gguf_has_experts(moe_path):
    assert experts.has_experts(moe_path)
    assert experts.expert_layers([3, 1, 1], 2) == [(0, 4), (4, 5)]


def test_expert_placement_matches_one_process(moe_path, workers, tmp_path):
    endpoints = workers(2)
    text, result, weights = split(moe_path, endpoints, [1, 1, 2], tmp_path, True, 24)
    assert result.completion_tokens == 24 and text
    assert text == single(moe_path, 24, tmp_path)
    remote = sum(mib for buffer, mib in weights.items() if buffer.startswith("RPC"))
    # Expert tensors (3 per layer x EXPERTS x FF x DIM x 4 bytes) went to the workers, nothing else did.
    assert remote == pytest.approx(LAYERS * 3 * EXPERTS * FF * DIM * 4 / 2**20, abs=0.1)
    assert sum(1 for buffer in weights if buffer.startswith("RPC")) == 2


def test_layer_split_matches_one_process(model_path, workers, tmp_path):
    endpoints = workers(1)
    text, result, weights = split(model_path, endpoints, [12, 18], tmp_path, False, 24)
    assert text == single(model_path, 24, tmp_path)
    assert any(b.startswith("RPC") and mib > 10 for b, mib in weights.items())


def test_dead_worker_ends_the_split_model_not_the_caller(model_path, workers, tmp_path):
    import os
    import signal
    endpoints = workers(1)
    model = SplitModel("k", model_path, 512, endpoints, [15, 15], tmp_path / "split.log", threads=1).start(timeout=120)
    try:
        request = parse({"model": "m", "prompt": PROMPT, "max_tokens": 200, "temperature": 0.0, "stream_id": 1})
        stream = model.generate(request, threading.Event(), Generation())
        next(stream)
        os.kill(rpc_server_pid(workers.made[0]), signal.SIGKILL)  # llama.cpp's RPC client aborts its process then
        with pytest.raises(WireError) as failed:
            for _ in stream:
                pass
        assert failed.value.code == "unreachable" and "ended" in failed.value.message
        assert not model.alive
    finally:
        model.close()


def test_frozen_worker_is_stopped_within_the_bound(model_path, workers, tmp_path):
    import os
    import signal
    import time
    endpoints = workers(1)
    model = SplitModel("k", model_path, 512, endpoints, [15, 15], tmp_path / "split.log", threads=1,
                       freeze_s=3.0).start(timeout=120)
    worker = rpc_server_pid(workers.made[0])
    try:
        request = parse({"model": "m", "prompt": PROMPT, "max_tokens": 400, "temperature": 0.0, "stream_id": 1})
        stream = model.generate(request, threading.Event(), Generation())
        next(stream)
        os.kill(worker, signal.SIGSTOP)  # RPC sets no socket timeouts: only our bound ends this
        stopped = time.monotonic()
        with pytest.raises(WireError) as failed:
            for _ in stream:
                pass
        assert failed.value.code == "timeout" and time.monotonic() - stopped < 10
        assert not model.alive
    finally:
        os.kill(worker, signal.SIGCONT)
        model.close()


def test_a_load_that_moves_nothing_is_stopped(model_path, tmp_path):
    import socket
    import time
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers: like a stuck tunnel
    try:
        model = SplitModel("k", model_path, 512, [f"127.0.0.1:{silent.getsockname()[1]}"], [15, 15],
                           tmp_path / "split.log")
        started = time.monotonic()
        with pytest.raises(WireError) as stuck:
            model.start(moved=lambda: 0, quiet_s=2.0)
        assert stuck.value.code == "timeout" and time.monotonic() - started < 10
        assert not model.alive
    finally:
        silent.close()


def test_cancel_stops_a_split_generation_and_the_model_serves_on(model_path, workers, tmp_path):
    endpoints = workers(1)
    model = SplitModel("k", model_path, 512, endpoints, [15, 15], tmp_path / "split.log", threads=1).start(timeout=120)
    try:
        request = parse({"model": "m", "prompt": PROMPT, "max_tokens": 300, "temperature": 0.0, "stream_id": 1})
        cancel, result = threading.Event(), Generation()
        for count, _ in enumerate(model.generate(request, cancel, result), 1):
            cancel.set()
        assert result.finish_reason == "cancelled" and count < 20 and model.alive
        again = Generation()
        assert b"".join(p.data for p in model.generate(parse({**{"model": "m", "prompt": PROMPT, "stream_id": 2},
                                                             "max_tokens": 8, "temperature": 0.0}),
                                                       threading.Event(), again))
        assert again.completion_tokens == 8
    finally:
        model.close()
