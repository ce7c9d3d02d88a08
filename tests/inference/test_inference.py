"""Streamed inference against a real tower process and the real SmolLM2 model."""

import signal
import subprocess
import sys
import time

import pytest

from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.node.connection import wait_until
from tests.conftest import rngrid
from tests.gateway_support import live_load, wait_idle
from testbed.leftovers import end

LONG_PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"
#: What the tower logs when a client cancels a stream, and when a Link closes under a running one.
CANCELLED, CLOSED = "a cancel from the client", "link closed with 1 stream(s) running"


@pytest.fixture(scope="module")
def tower(hub, model_path):
    # One slot and queue_depth 0: a second request while one runs is answered
    # "busy", which makes a slot that was not freed visible.
    t = hub.start_tower("inf-a", models={DEFAULT_ALIAS: {"path": model_path, "parallel": 1}},
                        limits={"queue_depth": 0})
    hub.wait_tower(t.name)
    yield t
    hub.stop_towers([t])


def run(hub, tower, **payload):
    stream = hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, **payload}, tower=tower.name)
    pieces = list(stream)
    assert isinstance(pieces[-1], Usage)
    return "".join(pieces[:-1]), pieces[-1]


def test_stream_is_incremental(hub, tower):
    started = time.perf_counter()
    stream = hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": LONG_PROMPT,
                                               "max_tokens": 200, "temperature": 0.0}, tower=tower.name)
    arrivals = []
    for piece in stream:
        if not isinstance(piece, Usage):
            arrivals.append(time.perf_counter() - started)
    usage = stream.usage
    assert usage.completion_tokens == 200 and usage.finish_reason == "length"
    assert len(arrivals) >= 20, "tokens arrive as separate pieces, not as one block"
    print(f"first piece {arrivals[0] * 1000:.0f} ms, last {arrivals[-1] * 1000:.0f} ms, {len(arrivals)} pieces")
    assert arrivals[0] < 0.25 * arrivals[-1], "first piece must arrive long before the last token"
    assert usage.tokens_per_s > 0 and usage.ttft_s > 0 and usage.prompt_tokens > 10 and usage.tower == tower.name


@pytest.mark.parametrize("prompt", [LONG_PROMPT, "The three primary colors are", "def fibonacci(n):"])
def test_joined_stream_equals_non_streamed_completion(hub, tower, reference, prompt):
    text, usage = run(hub, tower, prompt=prompt, max_tokens=64, temperature=0.0)
    ref_text, _, ref = reference.run(64, prompt=prompt)
    assert text == ref_text
    assert usage.completion_tokens == ref.completion_tokens
    assert usage.prompt_tokens == ref.prompt_tokens


def test_chat_stream_equals_chat_completion(hub, tower, reference):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name two planets."}]
    text, usage = run(hub, tower, messages=messages, max_tokens=48, temperature=0.0)
    ref_text, _, ref = reference.run(48, messages=messages)
    assert text == ref_text
    assert usage.finish_reason == ref.finish_reason


@pytest.mark.parametrize("prompt", ["Emoji list: 😀 😃 😄 😁 😆", "中文：你好，世界！我们"])
def test_emoji_and_cjk_never_broken(hub, tower, reference, prompt):
    stream = hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": prompt, "max_tokens": 30,
                                               "temperature": 0.0}, tower=tower.name)
    pieces = [p for p in stream if not isinstance(p, Usage)]
    text = "".join(pieces)
    assert any(ord(ch) > 0x2E80 for ch in text), f"expected emoji/CJK output, got {text!r}"
    assert "\ufffd" not in text and all("\ufffd" not in p for p in pieces)
    assert text == reference.completion(prompt, 30)


def test_stop_strings_are_held_back(hub, tower):
    text, usage = run(hub, tower, prompt=LONG_PROMPT, max_tokens=100, temperature=0.0, stop=[" 9,"])
    assert usage.finish_reason == "stop" and text.endswith("8,") and " 9" not in text


def test_cancel_frees_the_tower(hub, tower):
    stream = hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": LONG_PROMPT,
                                               "max_tokens": 3000, "temperature": 0.0}, tower=tower.name)
    iterator = iter(stream)
    for _ in range(5):
        next(iterator)
    assert live_load(hub, tower).streams == 1
    with pytest.raises(WireError) as busy:
        run(hub, tower, prompt="hi", max_tokens=4)
    assert busy.value.code == Code.BUSY and busy.value.retry_after > 0
    stream.cancel()
    assert wait_idle(hub, tower), "the tower kept generating after cancel"
    text, usage = run(hub, tower, prompt="hi", max_tokens=4)
    assert usage.completion_tokens > 0


def test_the_cli_retries_while_the_tower_is_busy(hub, tower, tmp_path):
    import shutil
    home = tmp_path / "cli"
    home.mkdir()
    shutil.copy(hub.grid.home / "identity", home / "identity")
    args = ["infer", "-m", DEFAULT_ALIAS, "--tower", tower.name, "--max-tokens", "4", "--connect", tower.address]
    stream = hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": LONG_PROMPT,
                                               "max_tokens": 3000, "temperature": 0.0}, tower=tower.name)
    iterator = iter(stream)
    next(iterator)
    waiting = None
    try:
        try:
            refused = rngrid(*args, "--busy-wait", "0", "hi", home=home)
            assert refused.returncode == 1 and "busy" in refused.stderr, refused.stderr
            waiting = subprocess.Popen([sys.executable, "-m", "reticulum_grid", "--home", str(home), *args, "hi"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # Blocks until the CLI reports the busy tower (or exits).
            told = next((line for line in waiting.stderr if "trying again" in line), "")
            assert told, "the CLI did not wait for the busy tower"
        finally:
            stream.cancel()
        out, rest = waiting.communicate(timeout=120)
        assert waiting.returncode == 0 and "tokens from" in rest, told + rest
    finally:
        end(waiting)  # a failed assertion must not leave the CLI behind


def test_breaking_out_of_the_loop_cancels(hub, tower):
    for i, piece in enumerate(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": LONG_PROMPT,
                                                                "max_tokens": 3000, "temperature": 0.0},
                                                               tower=tower.name)):
        if i == 3:
            break
    assert wait_idle(hub, tower)


@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_client_gone_frees_the_tower(hub, tower, tmp_path, how):
    """Ctrl-C sends a cancel; a killed client drops the link. Either way the tower stops
    (its log says which of the two it was told)."""
    from reticulum_grid.node.allowlist import allow
    client_id = rngrid("id", home=tmp_path).stdout.strip()
    allow(tower.config_path, client_id, ["infer"])
    proc = subprocess.Popen([sys.executable, "-m", "reticulum_grid", "--home", str(tmp_path), "infer",
                             "--connect", tower.address, "-m", DEFAULT_ALIAS, "--max-tokens", "4000", "--temperature", "0",
                             "--raw", LONG_PROMPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            # A shell starts background jobs with SIGINT ignored, and that is inherited:
                            # give the CLI the disposition it has when a user runs it in a terminal.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.read(10), "the CLI streamed nothing"
        assert live_load(hub, tower).streams == 1
        cancels, closes = tower.log().count(CANCELLED), tower.log().count(CLOSED)
        proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
        proc.wait(20)
        started = time.monotonic()
        assert wait_idle(hub, tower, timeout=30), "the tower kept generating for a client that is gone"
        print(f"{how}: tower idle {time.monotonic() - started:.2f} s after the client went")
    finally:
        proc.kill()
        proc.wait()
    if how == "sigint":
        assert proc.returncode == 130
        assert tower.log().count(CANCELLED) == cancels + 1, "Ctrl-C sent no cancel (the tower only saw the link go)"
    else:
        assert tower.log().count(CANCELLED) == cancels, "a killed client cannot send a cancel"
        assert wait_until(lambda: tower.log().count(CLOSED) > closes, 30), "the tower never saw the link go"
