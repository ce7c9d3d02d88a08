"""Shared by the split tests: the prompt and model they ask for, a split client in
its own process, and lending towers that grant each other ``shard``."""

import contextlib
from pathlib import Path
from typing import NamedTuple

import pytest

from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers
from reticulum_grid.store.blobstore import BlobStore
from tests.client_process import ClientProcess

#: The default model under a name only the split modules' towers hold.
ALIAS = "split-smol"
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]


class Client(ClientProcess):
    """A split client in its own process (tests/client_process.py), asking for PROMPT
    of ALIAS unless ``model`` or ``messages`` say otherwise."""

    def send(self, max_tokens, wait_towers=3, wait_names=(), **extra):
        self.ask({"model": ALIAS, "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0.0, **extra},
                 wait_towers, wait_names)

    def result(self, timeout=180):
        """(text, usage or None, error or None, plan) of the request in flight."""
        return super().result(timeout)[:4]


def lender(hub, name, group, grants, connect=(), models=None, holds=(), **sections):
    """The tower ``name`` of ``group`` (the names of the towers that lend to each
    other), not started: the hub gets ``infer``, every other tower of ``group``
    ``shard``, and each identity hash in ``grants`` its roles; ``holds``: (GGUF
    path, alias) models put in its store first; ``sections``: TowerProcess's
    (shard, dataplane, ...). The hub stops it at the end, whatever happens."""
    allow = {hub.grid.identity_hash: ["infer"], **grants}
    allow.update({hub.tower_identity(other): ["shard"] for other in group if other != name})
    made = TowerProcess(hub.root, name, models or {}, allow=allow, connect=[hub.address, *connect], **sections)
    store = BlobStore(made.dir / "blobs")
    for path, alias in holds:
        store.add_file(path, alias=alias, kind="model")
    hub.towers.append(made)
    return made


class Home(NamedTuple):
    """A home folder holding an identity, and that identity's hash in hex."""
    path: Path
    identity: str


def identity_home(tmp_path_factory, name):
    """A new home folder ``name`` holding an identity (made now): a Home."""
    home = tmp_path_factory.mktemp(name)
    return Home(home, load_or_create(home / "identity").hash.hex())


def identity_fixture(name, doc):
    """A module-scoped fixture giving identity_home(``name``), made once per module;
    ``doc`` says whose home it is (what the module's towers grant it)."""
    def home(tmp_path_factory):
        return identity_home(tmp_path_factory, name)
    home.__doc__ = doc
    return pytest.fixture(scope="module")(home)


@contextlib.contextmanager
def client_of(hub, home, towers, heard=None):
    """A Client in ``home`` (trusting the towers started here) that dials every tower
    of ``towers`` ({name: TowerProcess}), once the hub heard the ones named in
    ``heard`` (all by default) and each answered caps/full; the client closed and
    every tower stopped when the block ends."""
    trust_local_towers(home)
    # A new tower reads the GGUF's metadata once (seconds on a busy machine) before its caps/full is quick.
    hub.grid.caps_full([hub.wait_tower(n) for n in (heard or towers)], timeout=60)
    client = Client(home, [t.address for t in towers.values()])
    try:
        yield client
    finally:
        client.close()
        for made in towers.values():
            made.stop()
