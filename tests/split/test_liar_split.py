"""A tower that claims to lend memory it does not have spoils one split request at most.

Real tower processes on loopback, llama.cpp's RPC and the real model: lend-a holds the
GGUF and lends 200 MiB; lend-liar (tests/hostile_tower.py: the real tower, altered)
announces 190 MiB while its RPC server can hold 17 MiB. The model needs ~316 MiB, so the
first plan is lend-a with lend-liar: it fails to load there, and the client marks the claim
in its home (client/measured.py). Then lend-b joins (200 MiB) and the next requests, each a
separate `rngrid infer` process, plan lend-a with lend-b: lend-liar is not asked again.
"""

import json

import pytest

from reticulum_grid.client import measured
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import TowerProcess
from reticulum_grid.node.trust import tower_destination
from reticulum_grid.store.blobstore import BlobStore
from tests.conftest import rngrid
from tests.hostile_tower import HostileTower
from testbed.requirements import needs

pytestmark = needs("llama-rpc", "split inference rides on llama.cpp's RPC backend")

ALIAS = "liar-split-smol"  # only this module's towers have it
NAMES = ("lend-a", "lend-b", "lend-liar")


@pytest.fixture(scope="module")
def lenders(hub, model_path, tmp_path_factory):
    home = tmp_path_factory.mktemp("liar-split")
    client_id = load_or_create(home / "identity").hash.hex()
    ids = {n: hub.tower_identity(n) for n in NAMES}

    def allow(name):
        return {client_id: ["infer"], **{ids[other]: ["shard"] for other in NAMES if other != name}}

    a = TowerProcess(hub.root, "lend-a", {}, allow=allow("lend-a"), connect=[hub.address],
                     shard={"lend_mib": 200, "threads": 1})
    BlobStore(a.dir / "blobs").add_file(model_path, alias=ALIAS, kind="model")
    liar = HostileTower(hub.root, "lend-liar", {}, claim={"lend_mib": 190}, rpc_headroom_mib=16, trusted=True,
                        allow=allow("lend-liar"), connect=[hub.address, a.address], shard={"lend_mib": 1, "threads": 1})
    b = TowerProcess(hub.root, "lend-b", {}, allow=allow("lend-b"), connect=[hub.address, a.address],
                     shard={"lend_mib": 200, "threads": 1})
    hub.towers += [a, liar, b]  # the hub stops them at the end, whatever happens here
    a.start()
    liar.start()
    hub.grid.caps_full([hub.wait_tower("lend-a"), hub.wait_tower("lend-liar")], timeout=60)
    yield {"lend-a": a, "lend-b": b, "lend-liar": liar}, home
    hub.stop_towers([a, liar, b])


def infer(home, towers):
    connect = [arg for t in towers for arg in ("--connect", t.address)]
    return rngrid("infer", "-m", ALIAS, "--split", "always", "--max-tokens", "4", "--temperature", "0", "--json",
                  *connect, "Say hello.", home=home, timeout=300)


def liar_figures(home, liar):
    kept = json.loads((home / measured.FILE).read_text())["towers"]
    return kept.get(tower_destination(liar.identity_hash).hex(), {})


def test_a_lender_that_cannot_hold_its_part_is_not_planned_again(hub, lenders):
    towers, home = lenders
    a, b, liar = towers["lend-a"], towers["lend-b"], towers["lend-liar"]
    first = infer(home, [a, liar])
    print(f"first request: rc {first.returncode}: {first.stderr[-600:]}")
    assert first.returncode != 0 and "does not fit" in first.stderr, first.stderr[-2000:]
    marked = liar_figures(home, liar)
    assert marked.get("lend_failed_mib", 0) > 0, marked  # the part it could not hold
    b.start()
    hub.wait_tower("lend-b")
    served = []
    for _ in range(2):
        run = infer(home, [a, liar, b])
        assert run.returncode == 0, run.stderr[-2000:]
        served.append([json.loads(line)["usage"] for line in run.stdout.splitlines() if '"usage"' in line][0]["tower"])
    print(f"then: {served}; the liar's figures: {liar_figures(home, liar)}")
    assert all("lend-liar" not in s and "lend-a" in s and "lend-b" in s for s in served), served
    assert liar_figures(home, liar) == marked  # never failed again: it was not in a plan
