"""Field cases on real tower processes: context windows that are not a
multiple of 256, empty prompts, max_tokens inside a character, continuation
on a cold tower, and leftovers a store collects."""

import os
import time

import pytest

from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.inference.registry import ModelRegistry
from reticulum_grid.node.config import ConfigError, ModelConfig
from reticulum_grid.store.blobstore import BlobStore
from links import manifest as mf

FOX = "The quick brown fox jumps over the lazy dog. "
ESSAY = "Write a short essay about why the sea is salty, with an introduction, three arguments and a conclusion."
#: The window a user wrote for the tiny tower: not a multiple of llama.cpp's 256.
TINY_CTX = 128


def start_tower(hub, name, models, n_ctx=None, roles=("infer",), **sections):
    tower = hub.start_tower(name, models, roles=roles, n_ctx=n_ctx, **sections)
    hub.wait_tower(name)
    return tower


@pytest.fixture(scope="module")
def tiny(hub, model_path, tmp_path_factory):
    """A tower serving the bundled model as "tiny" with a 128-token window; it
    collects unreferenced blobs after 6 s (longer than validating a job takes). Before it starts, its store gets an
    abandoned partial transfer and an old blob without an alias."""
    scratch = tmp_path_factory.mktemp("leftovers")
    store = BlobStore(hub.root / "field-tiny" / "blobs")
    orphan = scratch / "orphan.txt"
    orphan.write_bytes(os.urandom(3000))
    kept = scratch / "kept.txt"
    kept.write_bytes(os.urandom(3000))
    orphan_hex = store.add_file(orphan, kind="file", copy=True).hex
    kept_hex = store.add_file(kept, alias="kept", kind="file", copy=True).hex
    abandoned = scratch / "abandoned.bin"
    abandoned.write_bytes(os.urandom(5000))
    manifest = mf.build(abandoned)
    store.receive(manifest.blob_id, manifest.pack()).release()
    old = time.time() - 3600
    for directory in (store.root / "objects" / orphan_hex, store.root / "objects" / kept_hex,
                      store.root / "partial" / manifest.blob_id.hex()):
        for path in [directory, *directory.iterdir()]:
            os.utime(path, (old, old))
    tower = start_tower(hub, "field-tiny", {"tiny": model_path}, n_ctx=TINY_CTX, roles=("infer", "sync", "train"),
                        limits={"unreferenced_s": 6})
    tower.leftovers = {"orphan": orphan_hex, "kept": kept_hex, "partial": manifest.blob_id.hex()}
    yield tower
    hub.stop_towers([tower])


@pytest.fixture(scope="module")
def warm(hub):
    tower = start_tower(hub, "field-warm", {DEFAULT_ALIAS: _model()})
    yield tower
    hub.stop_towers([tower])


@pytest.fixture(scope="module")
def cold(hub):
    tower = start_tower(hub, "field-cold", {DEFAULT_ALIAS: _model()})
    yield tower
    hub.stop_towers([tower])


def _model():
    from reticulum_grid.inference.default_model import default_model_path
    return default_model_path()


def run(hub, tower, model=DEFAULT_ALIAS, **payload):
    stream = hub.grid.execute("ai/inference", {"model": model, **payload}, tower=tower.name)
    pieces = list(stream)
    assert isinstance(pieces[-1], Usage)
    return "".join(pieces[:-1]), pieces[-1], stream.ids


def refusal(hub, tower, model=DEFAULT_ALIAS, **payload):
    with pytest.raises(WireError) as e:
        run(hub, tower, model, **payload)
    return e.value


# -- case 2: context windows that are not a multiple of 256 ------------------
@pytest.mark.parametrize("repeat", [14, 30])
def test_prompt_beyond_an_odd_window_is_refused_against_it(hub, tiny, repeat):
    error = refusal(hub, tiny, "tiny", prompt=FOX * repeat, max_tokens=8)
    assert error.code == Code.CONTEXT_LENGTH_EXCEEDED, error
    assert f"the context window is {TINY_CTX} tokens" in error.message


def test_generation_stops_at_an_odd_window(hub, tiny):
    text, usage, _ = run(hub, tiny, "tiny", prompt=FOX * 9, max_tokens=500, temperature=0.0)
    assert usage.finish_reason == "length" and usage.prompt_tokens + usage.completion_tokens == TINY_CTX


def test_a_window_of_one_token_is_refused_naming_the_key(tmp_path, model_path):
    from reticulum_grid.node.config import load_tower, write_tower
    path = tmp_path / "tower.toml"
    write_tower(path, "t", {"m": {"path": model_path, "n_ctx": 1}})
    with pytest.raises(ConfigError, match="models.m.n_ctx = 1"):
        load_tower(path)


def test_every_window_a_user_may_write(model_path, tmp_path):
    from reticulum_grid.inference.generation import ContextLengthExceeded, prompt_tokens
    from reticulum_grid.inference.runner import Runner
    from reticulum_grid.inference.runner_spec import RunnerSpec
    for n_ctx in (2, 100, 257):
        runner = Runner(RunnerSpec(str(model_path), n_ctx=n_ctx, threads=1), tmp_path / f"runner-{n_ctx}.log").start()
        try:
            assert runner.props["default_generation_settings"]["n_ctx"] == n_ctx
            with pytest.raises(ContextLengthExceeded, match=f"context window is {n_ctx} tokens"):
                prompt_tokens(runner, prompt=FOX * 40)
        finally:
            runner.close()


# -- case 3: input llama.cpp cannot start from -------------------------------
@pytest.mark.parametrize("payload", [{"prompt": ""}, {"messages": []}, {"prompt": "", "continue_tokens": [42]}])
def test_empty_prompt_is_a_bad_request(hub, tiny, payload):
    error = refusal(hub, tiny, "tiny", **payload)
    assert error.code == Code.BAD_REQUEST, error
    assert "empty" in error.message or "length 0" in error.message, error
    text, usage, _ = run(hub, tiny, "tiny", prompt="Hello", max_tokens=2)
    assert usage.completion_tokens > 0, "the tower keeps serving"
    assert "generation failed" not in tiny.log() and "AssertionError" not in tiny.log()


# -- case 10: max_tokens that ends inside a character -------------------------
EMOJI_PROMPT = "Repeat this emoji five times: 👩‍👩‍👧‍👦 👩‍👩‍👧‍👦 👩‍👩‍👧‍👦 👩‍👩‍👧‍👦"


def test_max_tokens_never_ends_inside_a_character(hub, warm, reference):
    """llama.cpp's server holds back a piece until its character is whole, and
    a limit reached inside a character ends the text before it: never a
    broken character, and max_tokens is the count generated."""
    _, _, longer = reference.run(8, prompt=EMOJI_PROMPT)
    assert longer.completion_tokens == 8
    for max_tokens in (1, 2, 3):
        text, usage, ids = run(hub, warm, prompt=EMOJI_PROMPT, max_tokens=max_tokens, temperature=0.0)
        assert usage.completion_tokens == max_tokens and "\ufffd" not in text
        assert text == reference.completion(EMOJI_PROMPT, max_tokens)
    assert reference.completion(EMOJI_PROMPT, 1) == "", "the prompt makes the first token a partial character"


# -- case 11: continuation on a tower that never ran the request ---------------
def test_continuation_equals_the_uninterrupted_run_on_a_cold_tower(hub, warm, cold):
    request = {"messages": [{"role": "user", "content": ESSAY}], "temperature": 0.0, "seed": 42}
    full_text, usage, ids = run(hub, warm, max_tokens=200, **request)
    assert len(ids) == usage.completion_tokens > 100
    plan = [(warm, 100)]  # its cache holds this very run: entries made the same way are reused
    plan += [(None, 0), (cold, 44), (warm, 60), (cold, 80)]
    for tower, k in plan:
        if tower is None:
            run(hub, warm, prompt="Name a colour.", max_tokens=5)  # the warm tower's cache now holds something else
            continue
        text, _, more = run(hub, tower, max_tokens=len(ids) - k, continue_tokens=ids[:k], **request)
        assert more == ids[k:], f"continuing at {k} on {tower.name} differs from token {k + _first_diff(more, ids[k:])}"
        assert full_text.endswith(text)


def _first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# -- case 9: leftovers --------------------------------------------------------
def test_leftovers_are_collected_after_the_stated_time(hub, tiny, tmp_path):
    blobs = hub.root / tiny.name / "blobs"
    left = tiny.leftovers
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and ((blobs / "objects" / left["orphan"]).exists() or
                                           (blobs / "partial" / left["partial"]).exists()):
        time.sleep(0.2)
    assert not (blobs / "objects" / left["orphan"]).exists(), "a blob without an alias stays"
    assert not (blobs / "partial" / left["partial"]).exists(), "an abandoned partial transfer stays"
    assert (blobs / "objects" / left["kept"] / "data").exists(), "an aliased blob must stay"

    bad = tmp_path / "broken.jsonl"
    bad.write_text('{"text": "fine"}\n{not json\n')
    with pytest.raises(WireError) as e:
        hub.grid.train({"base": "tiny", "output_alias": "never", "max_steps": 1}, data_path=bad, tower=tiny.name)
    assert e.value.code in (Code.BAD_REQUEST, Code.UNSUPPORTED), e.value
    pushed = mf.build(bad).blob_id.hex()
    assert hub.grid.store.info(bytes.fromhex(pushed)) is None, "the client keeps the refused dataset"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (blobs / "objects" / pushed).exists():
        time.sleep(0.2)
    assert not (blobs / "objects" / pushed).exists(), "the tower keeps the refused dataset"
    text, usage, _ = run(hub, tiny, "tiny", prompt="Hello", max_tokens=2)
    assert usage.completion_tokens > 0


# -- one file under two aliases with different settings -------------------------
def test_one_file_under_two_aliases_needs_one_set_of_settings(tmp_path, model_path):
    # A tower loads a file once; before, the second alias's n_ctx silently applied to both.
    store = BlobStore(tmp_path / "blobs")
    same = [ModelConfig("wide", str(model_path), n_ctx=4096), ModelConfig("narrow", str(model_path), n_ctx=96)]
    with pytest.raises(ConfigError, match="models.wide and models.narrow are the same file"):
        ModelRegistry(store, same)
    ModelRegistry(BlobStore(tmp_path / "ok"), [ModelConfig("a", str(model_path)), ModelConfig("b", str(model_path))])
