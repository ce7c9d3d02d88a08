"""The tower's engine (inference/runner.py) on real towers: llama-server runners
with parallel slots, per-request LoRA, embeddings, JSON schema, logprobs,
tool calls, speculative decoding, and what happens when a runner dies."""

import json
import math
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest

from reticulum_grid.client import ToolCallDelta, Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.inference.runner import KEY_ENV
from reticulum_grid.training.gguf_lora import peft_to_gguf
from testbed.tiny_models import renamed_copy
from tests.inference.concurrently import at_once

QUESTION = [{"role": "user", "content": "Name three animals that live in the sea."}]


def random_lora(path, base, seed, rank=4):
    """A GGUF LoRA on every q_proj of the bundled model with random weights
    (large enough to change the text), made with the project's converter."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(30):
        stem = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
        tensors[f"{stem}.lora_A.weight"] = rng.standard_normal((rank, 576)).astype(np.float32) * 0.3
        tensors[f"{stem}.lora_B.weight"] = rng.standard_normal((576, rank)).astype(np.float32) * 0.3
    peft_to_gguf(tensors, rank, base, path)
    return path


@pytest.fixture(scope="module")
def engine_tower(hub, model_path, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("engine")
    adapters = [(random_lora(scratch / f"lora-{i}.gguf", model_path, i), f"eng-lora-{i}", "adapter", True)
                for i in (1, 2)]
    tower = hub.start_tower("eng-a", models={DEFAULT_ALIAS: {"path": model_path, "parallel": 4}}, blobs=adapters)
    hub.wait_tower(tower.name)
    yield tower
    hub.stop_towers([tower])


def run(hub, tower, **payload):
    stream = hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "temperature": 0.0, **payload},
                              tower=tower.name)
    pieces = list(stream)
    assert isinstance(pieces[-1], Usage)
    return pieces[:-1], pieces[-1]


def text_of(pieces):
    return "".join(p for p in pieces if isinstance(p, str))


def runner_process(tower, name="llama-server"):
    """The tower's llama-server (under its guard), as a psutil.Process."""
    found = [p for p in psutil.Process(tower.proc.pid).children(recursive=True) if p.name() == name]
    assert found, f"{tower.name} runs no {name}"
    return found[0]


def test_four_concurrent_requests_all_complete(hub, engine_tower, reference):
    prompts = [f"{k}. Count from {k} to 900, separated by commas: {k}," for k in (3, 40, 150, 700)]
    results, errors = at_once(lambda prompt: run(hub, engine_tower, prompt=prompt, max_tokens=40),
                              [(p,) for p in prompts], timeout_s=300)
    assert not errors and len(results) == 4, errors
    for (prompt,), (pieces, usage) in results.items():
        assert usage.completion_tokens == 40 and "\ufffd" not in text_of(pieces)
    # Alone (one stream in the runner's batch), each is the text a fresh context gives (docs/engine.md).
    for prompt in prompts:
        assert text_of(run(hub, engine_tower, prompt=prompt, max_tokens=40)[0]) == reference.completion(prompt, 40)


def test_the_runner_port_refuses_a_request_without_its_key(engine_tower):
    runner = runner_process(engine_tower)
    argv = runner.cmdline()
    port = argv[argv.index("--port") + 1]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"

    def completion(headers):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", method="POST", headers=headers,
                                         data=json.dumps({"prompt": "Hello", "n_predict": 4}).encode())
        return urllib.request.urlopen(request, timeout=60)

    for headers in ({}, {"Authorization": "Bearer guessed"}):
        with pytest.raises(urllib.error.HTTPError) as refused:
            completion(headers)
        assert refused.value.code == 401
    # The key is in the runner's environment (/proc/PID/environ: its own user only), not on its command line
    # (/proc/PID/cmdline: every user): the one in the environment is the one the runner takes.
    key = runner.environ()[KEY_ENV]
    cmdline = (Path("/proc") / str(runner.pid) / "cmdline").read_bytes()
    assert "--api-key" not in argv and key.encode() not in cmdline
    assert oct(os.stat(f"/proc/{runner.pid}/environ").st_mode & 0o777) == "0o400"
    with completion({"Authorization": f"Bearer {key}"}) as reply:
        assert reply.status == 200


def test_two_adapters_at_once_and_scale_zero_is_base(hub, engine_tower):
    base = text_of(run(hub, engine_tower, messages=QUESTION, max_tokens=24)[0])

    def one(adapter, scale):
        return text_of(run(hub, engine_tower, messages=QUESTION, max_tokens=24, adapter=adapter,
                           adapter_scale=scale)[0])

    one("eng-lora-1", 1.0)  # the runner restarts with this adapter (between requests)
    answers, errors = at_once(one, [("eng-lora-1", 1.0), ("eng-lora-2", 1.0), ("eng-lora-2", 0.0)], timeout_s=300)
    assert not errors, errors
    assert answers[("eng-lora-2", 0.0)] == base, "scale 0 gives the base model's text"
    assert answers[("eng-lora-1", 1.0)] != base and answers[("eng-lora-2", 1.0)] != base
    assert answers[("eng-lora-1", 1.0)] != answers[("eng-lora-2", 1.0)], "each request gets its own adapter"
    assert text_of(run(hub, engine_tower, messages=QUESTION, max_tokens=24)[0]) == base, "no adapter: the base"


def test_embeddings_of_the_same_text_agree(hub, engine_tower):
    got = hub.grid.execute("ai/embeddings", {"model": DEFAULT_ALIAS,
                                             "input": ["The sea is salty.", "The sea is salty.", "Tax forms."]},
                           tower=engine_tower.name)
    assert len(got.vectors) == 3 and got.dims == 576 and got.prompt_tokens > 0 and got.tower == "eng-a"

    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    assert cosine(got.vectors[0], got.vectors[1]) == pytest.approx(1.0, abs=1e-6)
    assert cosine(got.vectors[0], got.vectors[2]) < 0.999


def test_a_json_schema_answer_parses_and_validates(hub, engine_tower):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
              "required": ["name", "legs"], "additionalProperties": False}
    pieces, usage = run(hub, engine_tower, messages=[{"role": "user", "content": "Describe a spider as JSON."}],
                        max_tokens=60, response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    answer = json.loads(text_of(pieces))
    assert set(answer) == {"name", "legs"} and isinstance(answer["name"], str) and isinstance(answer["legs"], int)
    assert usage.finish_reason == "stop"


def test_logprobs_come_with_the_text(hub, engine_tower):
    pieces, usage = run(hub, engine_tower, prompt="The capital of France is", max_tokens=8, logprobs=True,
                        top_logprobs=3)
    probs = [p for piece in pieces for p in piece.logprobs]
    assert len(probs) == usage.completion_tokens == 8
    assert all(p["logprob"] <= 0 and len(p["top"]) == 3 and all(t["logprob"] <= 0 for t in p["top"]) for p in probs)
    assert "".join(p["token"] for p in probs) == text_of(pieces)


def test_a_forced_tool_call_comes_back_as_a_call(hub, engine_tower):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                               "parameters": {"type": "object", "required": ["city"],
                                                              "properties": {"city": {"type": "string"}}}}}]
    pieces, usage = run(hub, engine_tower, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools,
                        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=60)
    # One call, in deltas as OpenAI streams it: its id and name first, then pieces of its arguments.
    deltas = [p for p in pieces if isinstance(p, ToolCallDelta)]
    assert {d.index for d in deltas} == {0} and deltas[0].name == "get_weather" and deltas[0].id
    assert isinstance(json.loads("".join(d.arguments for d in deltas))["city"], str)
    assert usage.finish_reason == "tool_calls"


def test_a_draft_model_runs_speculative_decoding(hub, model_path, tmp_path):
    draft = renamed_copy(model_path, tmp_path / "draft.gguf")  # another blob, the same weights: drafts hold
    tower = hub.start_tower("eng-draft", models={"spec": {"path": model_path, "draft": "spec-draft", "parallel": 1},
                                                 "spec-draft": {"path": draft, "parallel": 1}})
    hub.wait_tower(tower.name)
    try:
        stream = hub.grid.execute("ai/inference", {"model": "spec", "prompt": "Count from 1 to 100: 1, 2,",
                                                   "max_tokens": 48, "temperature": 0.0}, tower=tower.name)
        pieces = list(stream)
        usage = pieces[-1]
        assert usage.completion_tokens == 48 and "".join(pieces[:-1]).startswith(" 3, 4, 5")
        assert usage.draft_tokens > 0 and usage.draft_accepted > usage.draft_tokens / 2, usage
        runners = [p.cmdline() for p in psutil.Process(tower.proc.pid).children(recursive=True)
                   if p.name() == "llama-server"]
        assert any("-md" in argv and str(draft) in argv for argv in runners), runners
    finally:
        tower.stop()


def test_a_killed_runner_is_restarted_and_the_stream_goes_on(hub, engine_tower, reference):
    prompt = "Count from 1 to 3000: 1, 2,"
    stream = hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": prompt, "max_tokens": 200,
                                               "temperature": 0.0}, tower=engine_tower.name)
    pieces = iter(stream)
    next(pieces)
    killed = runner_process(engine_tower)
    killed.send_signal(signal.SIGKILL)
    rest = list(pieces)  # the tower restarts its runner; the stream continues from its tokens there
    assert engine_tower.proc.poll() is None, "the tower itself keeps running"
    assert runner_process(engine_tower).pid != killed.pid, "a new runner serves"
    usage = rest[-1]
    assert isinstance(usage, Usage) and usage.failovers == 1 and usage.completion_tokens == 200
    assert stream.text == reference.completion(prompt, 200), "continued exactly where the dead runner stopped"
    _, again = run(hub, engine_tower, prompt="Hello", max_tokens=4)
    assert again.completion_tokens == 4


def test_no_runner_outlives_a_killed_tower(hub, model_path):
    tower = hub.start_tower("eng-kill", models={DEFAULT_ALIAS: {"path": model_path, "parallel": 1}})
    hub.wait_tower(tower.name)
    runner = runner_process(tower)
    tower.proc.send_signal(signal.SIGKILL)
    tower.proc.wait(10)
    deadline = time.monotonic() + 20
    while runner.is_running() and runner.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not runner.is_running() or runner.status() == psutil.STATUS_ZOMBIE, "the runner outlived its tower"
    assert not os.path.exists(f"/proc/{runner.pid}/cmdline") or runner.status() == psutil.STATUS_ZOMBIE
