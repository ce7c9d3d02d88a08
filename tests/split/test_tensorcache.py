"""split/tensorcache.py on its own: names as ggml-rpc names them, the bound, and what clean removes."""

import os

from reticulum_grid.split.tensorcache import TensorCache, Tensor, fnv1a_64


def reader(blob):
    return lambda offset, size: blob[offset:offset + size]


def test_names_are_ggml_rpc_fnv1a_64():
    assert fnv1a_64(b"") == "cbf29ce484222325"  # FNV-1a 64's offset basis (ggml-rpc.cpp's fnv_hash)
    assert fnv1a_64(b"a") == "af63dc4c8601ec8c"


def test_the_cache_is_the_towers_own_and_bounded_least_recently_used_first(tmp_path):
    blob = os.urandom(4096)
    cache = TensorCache(tmp_path / "rpc-cache", bound=2048)
    assert oct((tmp_path / "rpc-cache").stat().st_mode & 0o777) == "0o700"
    assert cache.env == {"LLAMA_CACHE": str(tmp_path / "rpc-cache")}
    cache.seed([Tensor("a", 0, 1024)], reader(blob))
    cache.seed([Tensor("b", 1024, 1024)], reader(blob))
    cache.seed([Tensor("c", 2048, 1024), Tensor("huge", 0, 4096)], reader(blob))  # huge: over the bound, skipped
    names = sorted(p.name for p in cache.dir.iterdir())
    assert names == sorted([fnv1a_64(blob[1024:2048]), fnv1a_64(blob[2048:3072])]) and cache.size() == 2048


def test_clean_removes_foreign_and_corrupt_files(tmp_path):
    blob = os.urandom(2048)
    cache = TensorCache(tmp_path / "c")
    cache.seed([Tensor("a", 0, 1024), Tensor("b", 1024, 1024)], reader(blob))
    kept, broken = sorted(cache.dir.iterdir())
    (cache.dir / "0123456789abcdef").write_bytes(b"a peer's bytes")
    data = bytearray(broken.read_bytes())
    data[0] ^= 1
    broken.write_bytes(bytes(data))
    assert sorted(cache.clean()) == sorted(["0123456789abcdef", broken.name])
    assert [p.name for p in cache.dir.iterdir()] == [kept.name]
    # The corrupt one (whichever tensor it held) is rewritten from the source; the intact one is kept.
    assert cache.seed([Tensor("a", 0, 1024), Tensor("b", 1024, 1024)], reader(blob)) == (2, 1024)


def test_the_blocks_a_worker_seeds_are_those_layout_gives_it():
    from reticulum_grid.split.supervisor import layout, worker_blocks
    # A GPU coordinator: every block offloaded, workers first in order (tensor_split's order).
    assert layout([4, 6, 10], ["w1", "w2"], True)[:2] == (999, (4.0, 6.0, 11.0))
    assert worker_blocks([4, 6, 10], True) == [(0, 4), (4, 10)]
    # A CPU coordinator: the last sum(workers) blocks (+ the output layer) are offloaded to the workers.
    ngl, split, _ = layout([4, 6, 10], ["w1", "w2"], False)
    assert (ngl, split) == (11, (4.0, 7.0))
    assert worker_blocks([4, 6, 10], False) == [(10, 14), (14, 20)]
