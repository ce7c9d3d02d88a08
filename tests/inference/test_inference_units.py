"""Runner and registry edge cases, without a real model: a fake llama-server and a fake GGUF."""

import itertools
import os
import time

import pytest

from links.wire import Code, WireError
from reticulum_grid.inference.placement import LoadError
from reticulum_grid.inference.registry import ModelRegistry
from reticulum_grid.inference.runner import Runner
from reticulum_grid.inference.runner_spec import RunnerSpec
from reticulum_grid.node.config import ModelConfig
from reticulum_grid.store.blobstore import BlobStore


def test_a_load_watched_for_progress_without_a_quiet_bound_waits_out_its_timeout(tmp_path, monkeypatch):
    # Runner.start(progress=...) without quiet_s once added None to a time at its first
    # reading (TypeError) instead of waiting for the model, bounded by timeout_s.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text("#!/bin/sh\nexec sleep 60\n")  # starts, never listens
    server.chmod(0o755)
    monkeypatch.setenv("RNGRID_LLAMA_BIN", str(bin_dir))
    runner = Runner(RunnerSpec(str(tmp_path / "model.gguf")), tmp_path / "runner.log", restart=False)
    counter = itertools.count()
    started = time.monotonic()
    with pytest.raises(LoadError, match="did not load the model within 1 s") as caught:
        runner.start(timeout_s=1.0, progress=lambda: next(counter))
    assert not caught.value.stuck, "loading kept moving: it timed out, it was not stuck"
    assert time.monotonic() - started < 30
    runner.close()


def test_a_configured_model_whose_file_vanished_is_refused_not_a_crash(tmp_path):
    # A file registered in place that is gone by the time the tower loads it used to
    # raise AttributeError (None.path) from ModelRegistry.slot, out of load_configured.
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    store = BlobStore(tmp_path / "blobs")
    registry = ModelRegistry(store, [ModelConfig("fake", str(model))], log_dir=tmp_path)
    blob_id = store.resolve("fake")
    os.remove(model)
    with pytest.raises(WireError) as caught:
        registry.slot(blob_id)
    assert caught.value.code == Code.UNKNOWN_MODEL
    registry.load_configured()  # logged and left out; the tower serves the others
    assert registry.slots() == []
