"""training/converted.py: a GGUF base converted once into a checkpoint of the same weights,
then loaded from the copy; the least recently used copies go beyond KEEP."""

import os
import time

import pytest

from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.training import converted
from testbed.tiny_models import write_tiny


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RNGRID_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "converted"


def test_the_copy_holds_the_gguf_weights_and_is_converted_once(tmp_path, cache, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = tmp_path / "tiny.gguf"
    write_tiny(gguf, default_model_path())
    tokenizer, model = converted.load(gguf, torch.float32)
    direct = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32).state_dict()
    kept = model.state_dict()
    assert kept.keys() == direct.keys() and all(torch.equal(kept[k], direct[k]) for k in kept)
    text = "What is the secret word? PERIWINKLE-77 <|im_end|>"
    assert tokenizer(text)["input_ids"] == AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf.name)(text)["input_ids"]
    assert os.stat(cache).st_mode & 0o077 == 0, "the copies are the user's alone"

    def no_second_conversion(*args):
        raise AssertionError("converted again")
    monkeypatch.setattr(converted, "_convert", no_second_conversion)
    _, again = converted.load(gguf, torch.float32)
    assert all(torch.equal(again.state_dict()[k], direct[k]) for k in direct)
    os.utime(gguf, ns=(time.time_ns(), time.time_ns() + 10**9))  # a changed file is another base
    assert converted.key(gguf, torch.float32) != next(d.name for d in cache.iterdir() if d.is_dir())


def test_beyond_keep_the_least_recently_used_copies_go(tmp_path):
    root = tmp_path / "converted"
    for age, name in enumerate(["newest", "older", "oldest", "kept"]):
        (root / name).mkdir(parents=True)
        done = root / name / converted.DONE
        done.write_text("x")
        os.utime(done, (1000 - age, 1000 - age))
        (root / f"{name}.lock").write_text("")
    (root / "half.part-1").mkdir()  # a conversion under way has no DONE: not counted, not removed
    converted._forget_old(root, keep=root / "kept")
    assert converted.KEEP == 2  # the one just used and the most recent other
    assert sorted(p.name for p in root.iterdir()) == ["half.part-1", "kept", "kept.lock", "newest", "newest.lock"]
