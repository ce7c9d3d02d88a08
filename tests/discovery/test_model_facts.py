"""A model a tower receives after it started is described in ``caps/full`` (its
memory need and layer count, read from the GGUF in the background so the RNS
handler never waits on the file), as a model it started with is: a client
planning a split needs both (inference/facts.py)."""

import os
import time

from reticulum_grid.store import gguf_info


def blob_facts(hub, entry, alias):
    [(_, full)] = hub.grid.caps_full([entry], timeout=30)
    return full.blob(alias)


def test_a_model_received_after_start_gets_its_memory_need_and_layer_count(hub, model_path):
    tower = hub.start_tower("facts-a", models={}, roles=("infer", "sync"))
    entry = hub.wait_tower(tower.name)
    hub.grid.store.add_file(model_path, alias="facts-model", kind="model")
    hub.grid.push("facts-model", entry)
    deadline, blob = time.monotonic() + 60, None
    while time.monotonic() < deadline and (blob is None or None in (blob.need_mib, blob.n_layers)):
        blob = blob_facts(hub, entry, "facts-model")
        time.sleep(0.5)
    assert blob.n_layers == gguf_info.architecture(model_path)[1] == 30, blob
    # A model not in the tower's config gets the default context, 4096 tokens (node/config.py).
    assert blob.need_mib == gguf_info.need_mib(model_path, 4096, os.path.getsize(model_path)), blob
