"""A GGUF's facts are read once per machine, not once per process
(store/facts_cache.py): the next process, a tower starting, takes them from
the cache; a changed file or a damaged entry is read again."""

import json
import os
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest

from reticulum_grid.store import facts_cache, gguf_info


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder and no facts kept in this process; the gguf
    library's reads counted."""
    monkeypatch.setenv("RNGRID_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_info, "_facts", {})
    reads = []
    real = gguf.GGUFReader

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counted)
    return reads


@pytest.fixture
def model(tmp_path, model_path):
    """A copy of the bundled model (its 49,152 tokens make a read take seconds)."""
    copy = tmp_path / "model.gguf"
    shutil.copy(model_path, copy)
    return copy


@pytest.fixture
def small(tmp_path):
    """A GGUF of a few fields and one tensor, quick to read."""
    path = tmp_path / "small.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("token_embd.weight", np.zeros((3, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def forget():
    gguf_info._facts.clear()


def test_the_next_process_takes_the_facts_without_reading_the_file(cache, model):
    first = gguf_info.facts(model)
    assert cache == [str(model)] and len(list(facts_cache.folder().glob("*.json"))) == 1
    # Another process, whose gguf library cannot read at all, gets the same facts.
    code = ("import gguf, json, sys\n"
            "def refuse(*a, **k): raise AssertionError('the file was read again')\n"
            "gguf.GGUFReader = refuse\n"
            "from reticulum_grid.store import gguf_info\n"
            "f = gguf_info.facts(sys.argv[1])\n"
            "print(json.dumps([f.blocks, f.vocabulary, sorted(f.modules), f.quantization]))")
    out = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [first.blocks, first.vocabulary, sorted(first.modules), first.quantization]
    forget()
    assert gguf_info.facts(model) == first and cache == [str(model)]


def test_a_changed_file_is_read_again(cache, small):
    gguf_info.facts(small)
    stat = os.stat(small)
    os.utime(small, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    forget()
    gguf_info.facts(small)
    assert cache == [str(small)] * 2


@pytest.mark.parametrize("damage", [
    "{not json",
    "[1, 2]",
    json.dumps({"arch": "llama"}),  # fields missing
    "WRONG_TYPE",  # every field there, one of the wrong type
    "EXTRA_FIELD",
])
def test_a_damaged_entry_is_read_again_and_rewritten(cache, small, damage):
    first = gguf_info.facts(small)
    [entry] = facts_cache.folder().glob("*.json")
    good = json.loads(entry.read_text())
    if damage == "WRONG_TYPE":
        damage = json.dumps({**good, "blocks": "30"})
    elif damage == "EXTRA_FIELD":
        damage = json.dumps({**good, "colour": "red"})
    entry.write_text(damage)
    forget()
    assert gguf_info.facts(small) == first and cache == [str(small)] * 2
    assert json.loads(entry.read_text()) == good


def test_the_cache_keeps_the_newest_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("RNGRID_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(facts_cache, "MAX_ENTRIES", 3)
    files = []
    for k in range(5):
        files.append(tmp_path / f"f{k}")
        files[-1].write_bytes(b"x" * k)
        facts_cache.save(str(files[-1]), "form", {"k": k})
        entries = list(facts_cache.folder().glob("*.json"))
        os.utime(max(entries, key=lambda p: p.stat().st_mtime_ns), (k, 1_000_000 + k))  # written in this order
    assert len(list(facts_cache.folder().glob("*.json"))) == 3
    assert [facts_cache.load(str(f), "form") for f in files] == [None, None, {"k": 2}, {"k": 3}, {"k": 4}]
    assert facts_cache.load(str(files[4]), "another form") is None


def test_an_unwritable_cache_only_costs_a_read(cache, small, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("RNGRID_CACHE", str(blocker))
    first = gguf_info.facts(small)
    forget()
    assert gguf_info.facts(small) == first and cache == [str(small)] * 2
