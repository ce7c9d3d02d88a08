"""Weights that cross once (split/tensorcache.py): a worker tower that holds
the model seeds llama.cpp's RPC tensor cache from its own verified copy, so
its layers' large tensors do not cross the link; what a peer sends is never
kept; a corrupt cache file is found and rewritten before it can be served.

llama.cpp offers a tensor by hash only above 10 MiB (ggml-rpc.cpp's
HASH_THRESHOLD) and no tensor of the bundled model's layers is that large,
so this module writes a two-block model whose feed-forward tensors are
(11 MB each, Q8_0, random weights, the bundled model's tokenizer:
bench/gpu_models.py). Towers lend 150 MiB each; the model needs ~236 MiB, so a
plan takes two: cache-a (lending a little more, holding the model)
coordinates, cache-b (without the model at first) is the worker. The bytes
of each load are the coordinator's own count ("bytes crossed" in its log).
"""

import re

import pytest

from bench import gpu_models
from bench.split import drop_split_runner
from reticulum_grid.split.tensorcache import HASH_THRESHOLD
from reticulum_grid.store.blobstore import BlobStore
from testbed.requirements import needs
from tests.split.split_support import PROMPT, client_of, identity_home, lender

pytestmark = needs("llama-rpc", "split inference rides on llama.cpp's RPC backend")

ALIAS = "cache-test"
#: Two blocks; each feed-forward tensor 20480 x 512 Q8_0 = 11,141,120 bytes, above the threshold.
SHAPE = gpu_models.Shape(ALIAS, 2, 512, 20480, 8, 4, 49152, 4096, 100000.0, tied=True)
TOKENS = 16


@pytest.fixture(scope="module")
def cache_model(model_path, tmp_path_factory):
    path = tmp_path_factory.mktemp("cache-model") / f"{ALIAS}.Q8_0.gguf"
    gpu_models.write_model(path, SHAPE, model_path, gpu_models.Q8_0, seed=7)
    return path


@pytest.fixture(scope="module")
def cache_reference(cache_model, tmp_path_factory):
    from tests.reference import Reference
    ref = Reference(cache_model, tmp_path_factory.mktemp("cache-reference") / "runner.log", parallel=1, threads=1)
    yield ref
    ref.close()


@pytest.fixture(scope="module")
def cache_grid(hub, cache_model, tmp_path_factory):
    home, client_id = identity_home(tmp_path_factory, "cache-client")
    names = ["cache-a", "cache-b"]

    def tower(name, lend, connect=(), holds=()):
        return lender(hub, name, names, {client_id: ["infer"]}, connect, holds=holds, dataplane="127.0.0.1",
                      shard={"lend_mib": lend, "threads": 1, "cache_mib": 256})

    a = tower("cache-a", 160, holds=[(cache_model, ALIAS)])
    towers = {"cache-a": a.start(), "cache-b": tower("cache-b", 150, [a.address]).start()}
    with client_of(hub, home, towers) as client:
        yield towers, client, cache_model


def ask(client, reference, wait_towers=2):
    """One split request; returns its plan, checked for the unsplit text."""
    # A pipeline by name: only its workers hold whole blocks to seed (--split auto may pick tensor for this shape).
    client.send(max_tokens=TOKENS, wait_towers=wait_towers, model=ALIAS, placement="pipeline")
    text, usage, error, plan = client.result()
    assert error is None, error
    assert text == reference.chat(PROMPT, TOKENS)
    return plan


def loads(coordinator):
    """Bytes that crossed between the coordinator and its workers, per split model load so far."""
    return [int(n) for n in re.findall(r"split model loaded in .*?; (\d+) bytes crossed", coordinator.log())]


def cache_files(tower):
    return sorted((tower.dir / "rpc-cache" / "rpc").iterdir())


def test_without_the_model_every_load_sends_the_weights_and_nothing_is_kept(cache_grid, cache_reference):
    towers, client, _ = cache_grid
    assert ask(client, cache_reference) == ["cache-b", "cache-a"]
    drop_split_runner(towers["cache-a"].proc.pid)
    assert ask(client, cache_reference) == ["cache-b", "cache-a"]
    first, second = loads(towers["cache-a"])[-2:]
    assert first > 3 * HASH_THRESHOLD and second > 3 * HASH_THRESHOLD, (first, second)
    # The worker's RPC server wrote what the coordinator sent on the first load; the tower removed
    # it (a peer's bytes) before the second plan used the server, so the second load sent it all again.
    assert (towers["cache-b"].dir / "rpc-worker.log").read_text().count("saved to") >= 6


def test_a_worker_holding_the_model_moves_a_small_fraction(cache_grid, cache_reference):
    """Once the worker holds the GGUF (added to its store, as `rngrid add` or a finished pull leaves it),
    its first load and every later one move a small fraction of the bytes of a load without it."""
    towers, client, model = cache_grid
    full = loads(towers["cache-a"])[-1]
    BlobStore(towers["cache-b"].dir / "blobs").add_file(model, alias=ALIAS, kind="model")
    for _ in range(2):
        drop_split_runner(towers["cache-a"].proc.pid)
        assert ask(client, cache_reference) == ["cache-b", "cache-a"]
        assert loads(towers["cache-a"])[-1] <= 0.05 * full, (loads(towers["cache-a"]), full)
    assert len(cache_files(towers["cache-b"])) == 3  # the worker's block: ffn gate, up, down


def test_a_corrupt_or_foreign_cache_file_is_never_served(cache_grid, cache_reference):
    towers, client, _ = cache_grid
    worker = towers["cache-b"]
    files = cache_files(worker)
    good = files[0].read_bytes()
    broken = bytearray(good)
    broken[len(broken) // 2] ^= 0xFF  # same size, one byte flipped
    files[0].write_bytes(bytes(broken))
    foreign = files[0].parent / "00000000deadbeef"
    foreign.write_bytes(b"\0" * 1024)
    drop_split_runner(towers["cache-a"].proc.pid)
    assert ask(client, cache_reference) == ["cache-b", "cache-a"]  # the text is the unsplit one
    assert files[0].read_bytes() == good, "the tower rewrote the corrupt file from its verified copy"
    assert not foreign.exists(), "a file the tower did not seed is removed before a plan uses the server"
