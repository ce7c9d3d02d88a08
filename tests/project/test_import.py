"""`rngrid models import`: the GGUFs Ollama, the Hugging Face cache and LM
Studio keep, listed with their facts and registered in place under their
tools' names; a tower serves them by those names (imported, or named in its
config as ``ollama:...``/``hf:...``), and a file another program changes or
deletes is refused and reported, never served.

The stores are laid out as each tool writes them (tests/project/foreign_stores.py),
from the real default GGUF; a real tower and the real CLI serve and ask."""

import json
import os
from pathlib import Path

import pytest

from links.wire import WireError
from reticulum_grid.inference.registry import ModelRegistry
from reticulum_grid.node import config
from reticulum_grid.node.config import ConfigError, ModelConfig
from reticulum_grid.store import foreign, importing
from reticulum_grid.store.blobstore import BlobStore
from tests.conftest import rngrid
from tests.project.foreign_stores import (OLLAMA_MODEL, OLLAMA_PROJECTOR, OLLAMA_TEMPLATE, hf_model, lmstudio_model,
                                  ollama_model, write_gguf)
from testbed.tiny_models import write_tiny

HF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
HF_FILE = "smollm2-135m-instruct-q4_1.gguf"
TINY_REPO, TINY_FILE = "rngrid-tests/Tiny-GGUF", "tiny-f32.gguf"
LMS_DIR = "lmstudio-community/SmolLM2-135M-Instruct-GGUF"
#: Variables that move the stores: the tests give each CLI run its own.
STORE_ENV = ("OLLAMA_MODELS", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.fixture(scope="module")
def home(tmp_path_factory, model_path):
    """A home folder holding all three tools' stores at their default places."""
    home = tmp_path_factory.mktemp("import-home")
    made = tmp_path_factory.mktemp("import-ggufs")
    projector = write_gguf(made / "mmproj-smollm2-f32.gguf", "clip")
    mystery = write_gguf(made / "mystery.gguf", "notarch", tokenizer_source=model_path)
    tiny = made / TINY_FILE
    write_tiny(tiny, model_path)
    ollama = home / ".ollama" / "models"
    ollama_model(ollama, "smollm2", "135m", [(OLLAMA_MODEL, Path(model_path)), (OLLAMA_TEMPLATE, "{{ .Prompt }}")])
    ollama_model(ollama, "llava-mini", "latest", [(OLLAMA_MODEL, Path(model_path)), (OLLAMA_PROJECTOR, projector)])
    ollama_model(ollama, "mystery", "1b", [(OLLAMA_MODEL, mystery)])
    hub = home / ".cache" / "huggingface" / "hub"
    hf_model(hub, HF_REPO, {HF_FILE: model_path})
    hf_model(hub, TINY_REPO, {TINY_FILE: tiny})
    lmstudio_model(home / ".lmstudio" / "models", *LMS_DIR.split("/"),
                   {"SmolLM2-135M-Instruct-Q4_1.gguf": model_path, "mmproj-SmolLM2-135M-f32.gguf": projector})
    return home


def cli_env(home, **extra):
    env = {k: v for k, v in os.environ.items() if k not in STORE_ENV}
    return dict(env, HOME=str(home), **extra)


def snapshot(folder):
    """(path, size, mtime, link target) of everything under ``folder``: what a tool's store looks like."""
    return sorted((str(p), p.lstat().st_size, p.lstat().st_mtime_ns, os.readlink(p) if p.is_symlink() else "")
                  for p in Path(folder).rglob("*"))


def test_roots_follow_each_tools_variables(tmp_path):
    for folder in ("o", "h/hub", "x/huggingface/hub", "hh", ".lmstudio/models", ".ollama/models"):
        (tmp_path / folder).mkdir(parents=True)
    assert foreign.roots({"OLLAMA_MODELS": str(tmp_path / "o")}, tmp_path).ollama == (tmp_path / "o",)
    assert tmp_path / ".ollama/models" in foreign.roots({}, tmp_path).ollama
    assert foreign.roots({"HF_HOME": str(tmp_path / "h")}, tmp_path).hf == (tmp_path / "h/hub",)
    assert foreign.roots({"XDG_CACHE_HOME": str(tmp_path / "x")}, tmp_path).hf == (tmp_path / "x/huggingface/hub",)
    assert foreign.roots({"HF_HUB_CACHE": str(tmp_path / "hh"), "HF_HOME": str(tmp_path / "h")},
                         tmp_path).hf == (tmp_path / "hh",)
    assert foreign.roots({}, tmp_path).lmstudio == (tmp_path / ".lmstudio/models",)


def test_names_are_the_ones_each_tool_shows(tmp_path, model_path):
    small = write_gguf(tmp_path / "small.gguf", "llama", tokenizer_source=model_path)
    ollama, hub = tmp_path / "ollama", tmp_path / "hub"
    ollama_model(ollama, "smollm2", "latest", [(OLLAMA_MODEL, small)])
    ollama_model(ollama, "tiny", "q4", [(OLLAMA_MODEL, small)], namespace="me")
    ollama_model(ollama, "SmolLM2-GGUF", "Q4_1", [(OLLAMA_MODEL, small)], registry="hf.co", namespace="bartowski")
    hf_model(hub, "org/repo", {"old.gguf": small}, commit="1" * 40)
    hf_model(hub, "org/repo", {"sub/new.gguf": small}, commit="2" * 40)  # refs/main moves to it
    where = foreign.Roots((ollama,), (hub,), ())
    assert sorted(f.ref for f in foreign.scan(where)) == [
        "hf:org/repo/sub/new.gguf", "ollama:hf.co/bartowski/SmolLM2-GGUF:Q4_1", "ollama:me/tiny:q4",
        "ollama:smollm2:latest"]
    assert foreign.resolve("ollama:smollm2", where).name == "smollm2:latest"
    assert foreign.resolve("ollama:me/tiny:q4", where).name == "me/tiny:q4"
    assert foreign.resolve("ollama:hf.co/bartowski/SmolLM2-GGUF:Q4_1", where).path.parent == ollama / "blobs"
    assert foreign.resolve("hf:org/repo/sub/new.gguf", where).name == "new"
    for bad in ("ollama:../../etc:x", "hf:org/repo/old.gguf", "hf:org/../x.gguf", "lmstudio:a/b.gguf", "nowhere"):
        with pytest.raises(foreign.SourceError):
            foreign.resolve(bad, where)


def test_import_lists_every_tools_models_with_their_facts_and_reasons(home, model_path):
    listed = rngrid("models", "import", "--json", home=home / "rngrid", env=cli_env(home))
    assert listed.returncode == 0, listed.stderr
    rows = {r["ref"]: r for r in json.loads(listed.stdout)}
    size = os.path.getsize(model_path)
    for ref, name in [("ollama:smollm2:135m", "smollm2:135m"),
                      (f"hf:{HF_REPO}/{HF_FILE}", "smollm2-135m-instruct-q4_1"),
                      (f"lmstudio:{LMS_DIR}/SmolLM2-135M-Instruct-Q4_1.gguf", "SmolLM2-135M-Instruct-Q4_1")]:
        assert rows[ref]["name"] == name
        assert (rows[ref]["size"], rows[ref]["architecture"], rows[ref]["quantization"]) == (size, "llama", "Q4_1")
        assert rows[ref]["loadable"] is True and rows[ref]["problem"] is None, rows[ref]
    assert Path(rows["ollama:smollm2:135m"]["path"]).parent == home / ".ollama/models/blobs"
    assert "vision projector layer" in rows["ollama:llava-mini:latest"]["problem"]
    mystery = rows["ollama:mystery:1b"]
    assert mystery["architecture"] == "notarch" and mystery["loadable"] is False
    assert "architecture 'notarch' is not one the vendored llama.cpp loads" in mystery["problem"]
    projector = rows[f"lmstudio:{LMS_DIR}/mmproj-SmolLM2-135M-f32.gguf"]
    assert projector["architecture"] == "clip" and "vision projector (mmproj)" in projector["problem"]
    table = rngrid("models", "import", home=home / "rngrid", env=cli_env(home))
    assert table.returncode == 0 and "smollm2:135m" in table.stdout and "mystery:1b" in table.stdout


def test_a_folder_given_is_listed_and_a_split_model_says_why(home, tmp_path, model_path):
    folder = tmp_path / "models"
    lmstudio_model(folder, "me", "split", {"big-00001-of-00002.gguf": model_path})
    (folder / "me/split/big-00002-of-00002.gguf").write_bytes(b"GGUF")
    listed = rngrid("models", "import", str(folder), "--json", home=home / "rngrid", env=cli_env(home))
    (row,) = json.loads(listed.stdout)
    assert row["name"] == "big" and "split into 2 files" in row["problem"]


def test_a_damaged_or_foreign_file_is_listed_with_its_reason(home, tmp_path, model_path):
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "notes.gguf").write_text("not a model")
    (folder / "cut.gguf").write_bytes(Path(model_path).read_bytes()[:64])  # a download that stopped early
    rows = {Path(c.found.ref).name: c for c in map(importing.describe, foreign.scan_dir(folder))}
    assert "not a GGUF file of version 2 or 3" in rows["notes.gguf"].problem
    assert "metadata ends early" in rows["cut.gguf"].problem


def test_import_registers_in_place_under_the_tools_name(home, tmp_path):
    before = snapshot(home / ".ollama"), snapshot(home / ".cache"), snapshot(home / ".lmstudio")
    cli = tmp_path / "cli"
    # LM Studio's copy holds the same bytes as Ollama's: one blob, both names, the file registered last.
    for ref, alias in [(f"lmstudio:{LMS_DIR}/SmolLM2-135M-Instruct-Q4_1.gguf", "lms-smollm2"),
                       (f"hf:{TINY_REPO}/{TINY_FILE}", "tiny-f32"),
                       ("ollama:smollm2:135m", "smollm2:135m")]:
        args = ("--alias", alias) if alias == "lms-smollm2" else ()
        done = rngrid("models", "import", ref, *args, "--json", home=cli, env=cli_env(home))
        assert done.returncode == 0, done.stderr
        assert alias in json.loads(done.stdout)["aliases"]
    store = BlobStore(cli / "tower" / "blobs")  # the store `rngrid tower` uses by default
    infos = {a: i for i in store.list() for a in i.aliases}
    assert infos["smollm2:135m"].external and infos["smollm2:135m"].path.parent == home / ".ollama/models/blobs"
    tiny = infos["tiny-f32"]
    assert tiny.path.parent.name == "blobs" and not tiny.path.is_symlink(), "the HF snapshot's link is followed"
    assert not any((store.root / "objects" / i.hex / "data").exists() for i in infos.values()), "nothing copied"
    refused = rngrid("models", "import", "ollama:llava-mini", home=cli, env=cli_env(home))
    assert refused.returncode == 1 and "ollama:llava-mini:latest is not imported" in refused.stderr
    assert "vision projector layer" in refused.stderr
    refused = rngrid("models", "import", "ollama:mystery:1b", home=cli, env=cli_env(home))
    assert refused.returncode == 1 and "'notarch' is not one the vendored llama.cpp loads" in refused.stderr
    missing = rngrid("models", "import", "ollama:nothere:7b", home=cli, env=cli_env(home))
    assert missing.returncode == 1 and "Ollama has no model nothere:7b" in missing.stderr
    assert {a for i in BlobStore(cli / "tower" / "blobs").list() for a in i.aliases} == set(infos)
    assert (snapshot(home / ".ollama"), snapshot(home / ".cache"), snapshot(home / ".lmstudio")) == before


def test_a_changed_or_deleted_file_is_reported_and_never_served(tmp_path, model_path):
    copy = tmp_path / "model.gguf"
    copy.write_bytes(Path(model_path).read_bytes())
    store = BlobStore(tmp_path / "blobs")
    blob = store.add_file(copy, alias="m", kind="model").blob_id
    store.verify(blob)
    os.utime(copy, ns=(1, 1))  # touched, same bytes: hashed again and kept
    store.verify(blob)
    assert store.info(blob) is not None and not store.broken()
    with open(copy, "r+b") as f:
        f.seek(copy.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert store.info(blob) is not None, "unverified until a load verifies it"
    with pytest.raises(WireError, match="changed on disk") as e:
        store.verify(blob)
    assert e.value.code == "corrupt"
    assert store.info(blob) is None and store.list() == []
    assert BlobStore(tmp_path / "blobs").broken()[0].aliases == ["m"], "recorded for other processes too"
    with pytest.raises(WireError, match=r"model 'm' is not served: .* changed since it was registered") as e:
        ModelRegistry(store, []).find("m")  # a client that heard of it before asks for it
    assert e.value.code == "corrupt"
    again = store.add_file(copy, alias="m", kind="model")  # registered again: the new bytes, a new blob
    assert again.blob_id != blob and store.resolve("m") == again.blob_id
    copy.unlink()
    (gone,) = [b for b in store.broken() if b.aliases]
    assert "is gone" in gone.problem and store.list() == []
    with pytest.raises(WireError, match="is gone"):
        store.verify(again.blob_id)


def test_a_config_names_models_by_their_source(home, tmp_path, monkeypatch):
    for name in STORE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    config.write_tower(tmp_path / "tower.toml", "t", {"coder": "ollama:smollm2:135m", "f": "hf:a/b/c.gguf"})
    assert [m.path for m in config.load_tower(tmp_path / "tower.toml").models] == ["ollama:smollm2:135m",
                                                                                  "hf:a/b/c.gguf"]
    store = BlobStore(tmp_path / "blobs")
    ModelRegistry(store, [ModelConfig("coder", "ollama:smollm2:135m")])
    assert store.info(store.resolve("coder")).path.parent == home / ".ollama/models/blobs"
    with pytest.raises(ConfigError, match=r"models.v: ollama:llava-mini cannot be served: .*vision projector"):
        ModelRegistry(store, [ModelConfig("v", "ollama:llava-mini")])
    with pytest.raises(ConfigError, match=r"models.x: Ollama has no model nothere:latest"):
        ModelRegistry(store, [ModelConfig("x", "ollama:nothere")])


def test_a_config_refuses_a_source_file_that_is_not_what_its_tool_named(tmp_path, monkeypatch, model_path):
    small = write_gguf(tmp_path / "small.gguf", "llama", tokenizer_source=model_path)
    blob = ollama_model(tmp_path / "ollama", "small", "1", [(OLLAMA_MODEL, small)])[OLLAMA_MODEL]
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    store = BlobStore(tmp_path / "blobs")
    ModelRegistry(store, [ModelConfig("small", "ollama:small:1")])  # a tower starts with it
    first = store.resolve("small")
    with open(blob, "ab") as f:  # rewritten while no tower ran
        f.write(b"\0" * 32)
    with pytest.raises(ConfigError, match=r"models.small: ollama:small:1 cannot be served: .* does not hash to"):
        ModelRegistry(store, [ModelConfig("small", "ollama:small:1")])  # the next start
    assert store.resolve("small") == first, "the rewritten bytes were never registered"


@pytest.fixture(scope="module")
def tower(hub, home, tmp_path_factory):
    """A real tower whose config names a model by its Hugging Face cache entry,
    and which the CLI's identity (the ``cli`` home) may ask."""
    cli = tmp_path_factory.mktemp("import-cli")
    cli_id = rngrid("id", home=cli).stdout.strip()
    with pytest.MonkeyPatch.context() as env:  # the tower process inherits it
        env.setenv("HF_HUB_CACHE", str(home / ".cache/huggingface/hub"))
        t = hub.start_tower("import-a", models={"tiny": f"hf:{TINY_REPO}/{TINY_FILE}"},
                            allow={hub.grid.identity_hash: ["infer"], cli_id: ["infer"]})
    hub.wait_tower(t.name)
    t.cli = cli
    yield t
    hub.stop_towers([t])


def infer(tower, model, env):
    return rngrid("infer", "--connect", tower.address, "-m", model, "--max-tokens", "4", "--temperature", "0",
                  "--json", "Hello", home=tower.cli, env=env)


def test_a_tower_serves_imported_models_by_their_names_and_refuses_a_changed_one(tower, home):
    env = cli_env(home)
    imported = rngrid("models", "--config", str(tower.config_path), "import", "ollama:smollm2:135m",
                      home=tower.cli, env=env)
    assert imported.returncode == 0, imported.stderr
    answered = infer(tower, "smollm2:135m", env)  # announced by the running tower, loaded on first use
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout.splitlines()[-1])["usage"]["completion_tokens"] > 0
    assert infer(tower, "tiny", env).returncode == 0, "the config's hf: model"
    blob = next(p for p in (home / ".ollama/models/blobs").iterdir() if p.stat().st_size > 1 << 20)
    with open(blob, "r+b") as f:  # another program rewrites a byte of the weights
        f.seek(blob.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    refused = infer(tower, "smollm2:135m", env)
    assert refused.returncode != 0 and "corrupt" in refused.stderr and "changed on disk" in refused.stderr
    assert f"model smollm2:135m: {blob} changed on disk" in tower.log()
    again = infer(tower, "smollm2:135m", env)  # the tower announces it no more
    assert again.returncode != 0
    assert "no tower with model 'smollm2:135m' heard; heard: import-a (tiny)" in again.stderr
    reimport = rngrid("models", "--config", str(tower.config_path), "import", "ollama:smollm2:135m",
                      home=tower.cli, env=env)
    assert reimport.returncode == 1 and "does not hash to the SHA-256 its name gives" in reimport.stderr
    listed = rngrid("models", "--config", str(tower.config_path), "--wait", "0", home=tower.cli, env=env)
    assert "not served: smollm2:135m" in listed.stderr and "changed since it was registered" in listed.stderr
    assert infer(tower, "tiny", env).returncode == 0, "the tower serves its other models on"
