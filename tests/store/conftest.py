"""Fixtures of the store tests (tests/conftest.py's apply here too): a module that
sets SMALL_BYTES and HOLDER gets ``small`` (a file of that many random bytes),
``tower`` (the tower HOLDER holding it as the dataset blob "small") and ``conn``
(the hub's connection to that tower)."""

import pytest

from tests.store.blob_towers import holding, random_file


@pytest.fixture(scope="module")
def small(tmp_path_factory, request):
    return random_file(tmp_path_factory, "small.bin", request.module.SMALL_BYTES)


@pytest.fixture(scope="module")
def tower(hub, small, request):
    with holding(hub, small, "small", request.module.HOLDER) as (held,):
        yield held


@pytest.fixture(scope="module")
def conn(hub, tower):
    return hub.grid.connection(hub.wait_tower(tower.name))
