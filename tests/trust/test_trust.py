"""A client uses only the towers it trusts (node/trust.py), whatever the others announce.

Real tower processes on loopback: a trusted tower "big-tower", a stranger that
announces the same model (and does not even allow the client), and a stranger
that takes big-tower's name and claims 100,000 tokens/s (tests/hostile_tower.py:
the real tower, lying, writing down every prompt that reaches it). Then a
trusted liar that claims 100,000 tokens/s but streams slowly: the client ranks
towers by what it measured.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from links.wire import Code, WireError
from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.node import trust
from reticulum_grid.node.config import ConfigError
from reticulum_grid.node.identity import load_or_create
from tests.conftest import rngrid
from tests.hostile_tower import HostileTower

ALIAS = "trust-model"  # only this module's towers have it


def ask(grid, prompt, tower=None, max_tokens=4):
    pieces = list(grid.execute("ai/inference", {"model": ALIAS, "prompt": prompt, "max_tokens": max_tokens,
                                                "temperature": 0.0}, tower=tower))
    return pieces[-1]


@pytest.fixture(scope="module")
def grid3(hub, tmp_path_factory):
    home = tmp_path_factory.mktemp("trust-cli")
    cli_id = load_or_create(home / "identity").hash.hex()
    models = {ALIAS: default_model_path()}
    legit = hub.start_tower("big-tower", models=models, allow={hub.grid.identity_hash: ["infer"], cli_id: ["infer"]})
    plain = HostileTower(hub.root, "stranger-plain", models, allow={}, connect=[hub.address]).start()
    liar = HostileTower(hub.root, "stranger-liar", models, claim={"name": "big-tower", "tokens_per_s": 100000.0},
                        allow={hub.grid.identity_hash: ["infer"], cli_id: ["infer"]}, connect=[hub.address]).start()
    hub.towers += [plain, liar]
    hub.wait_tower("big-tower")
    strangers = {t.identity_hash for t in (plain, liar)}
    heard = hub.grid.wait_for(lambda _: {e.hash_hex for e in hub.grid.table.strangers()} >= {
        trust.tower_destination(h).hex() for h in strangers}, 60)
    assert heard, "the strangers' announces never arrived"
    # A tower just started answers slowly on a busy machine (it reads its GGUF): wait for its first answer.
    assert hub.grid.caps_full([hub.wait_tower("big-tower")], timeout=60)
    yield legit, plain, liar, home
    for t in (legit, plain, liar):
        t.stop()


def test_no_prompt_goes_to_a_stranger(hub, grid3):
    legit, plain, liar, _ = grid3
    towers = [ask(hub.grid, f"my secret prompt {n}").tower for n in range(10)]
    got = plain.received() + liar.received()
    print(f"prompts to the strangers: {len(got)} of 10; answers from {sorted(set(towers))}")
    assert got == [] and towers == ["big-tower"] * 10
    # The name is the trust entry's (or, with "", the trusted tower's own): the liar's claim never wins it.
    assert hub.grid.table.find("big-tower").destination_hash.hex() == trust.tower_destination(
        legit.identity_hash).hex()
    assert {e.name for e in hub.grid.table.strangers()} >= {"stranger-plain", "big-tower"}


def test_a_stranger_named_by_hash_is_refused_without_sending(hub, grid3):
    _, plain, _, _ = grid3
    destination = trust.tower_destination(plain.identity_hash).hex()
    started = time.monotonic()
    with pytest.raises(WireError) as e:
        ask(hub.grid, "my secret prompt by hash", tower=destination)
    assert e.value.code == Code.UNTRUSTED and f"rngrid trust {plain.identity_hash}" in e.value.message
    assert time.monotonic() - started < 10 and plain.received() == []


def test_the_cli_uses_only_trusted_towers_and_lists_strangers_apart(grid3):
    legit, plain, liar, home = grid3
    for n in range(2):
        run = rngrid("infer", "-m", ALIAS, "--tower", "big-tower", "--max-tokens", "2", "--json",
                     "--connect", legit.address, "--connect", plain.address, "--connect", liar.address,
                     f"my secret prompt by name {n}", home=home)
        assert run.returncode == 0, run.stderr[-2000:]
        usage = [json.loads(line)["usage"] for line in run.stdout.splitlines() if '"usage"' in line][0]
        assert usage["tower"] == "big-tower"
    assert plain.received() + liar.received() == []
    listed = rngrid("towers", "--json", "--wait", "8", "--connect", legit.address, "--connect", plain.address,
                    "--connect", liar.address, home=home)
    rows = json.loads(listed.stdout)
    trusted = {r["destination"] for r in rows if r["trusted"]}
    apart = {r["identity"] for r in rows if not r["trusted"]}
    assert trusted == {trust.tower_destination(legit.identity_hash).hex()}, rows
    assert apart == {plain.identity_hash, liar.identity_hash} and all(
        r["state"] == "untrusted" for r in rows if not r["trusted"])
    table = rngrid("towers", "--wait", "8", "--connect", legit.address, "--connect", plain.address, home=home)
    assert "not trusted" in table.stdout and plain.identity_hash in table.stdout, table.stdout


def test_trust_any_is_an_explicit_choice_with_a_warning(grid3, tmp_path):
    legit, plain, _, _ = grid3
    home = tmp_path / "mesh"
    load_or_create(home / "identity")
    (home / "client.toml").write_text("[trust]\nany = true\n")
    run = rngrid("towers", "--json", "--wait", "8", "--connect", legit.address, "--connect", plain.address,
                 home=home)
    assert "any = true" in run.stderr
    rows = json.loads(run.stdout)
    assert {r["name"] for r in rows if r["state"] != "untrusted"} >= {"big-tower", "stranger-plain"}


def bare_rngrid(*args, home):
    """The CLI with ``home`` as it is (conftest's rngrid() trusts the test towers first)."""
    return subprocess.run([sys.executable, "-m", "reticulum_grid", "--home", str(home), *args], capture_output=True,
                          text=True, timeout=60)


def test_trust_and_untrust_edit_client_toml(tmp_path):
    tower_id = load_or_create(tmp_path / "t" / "identity").hash.hex()
    other_id = load_or_create(tmp_path / "u" / "identity").hash.hex()
    added = bare_rngrid("trust", tower_id, "--name", "gpu-box", home=tmp_path)
    assert added.returncode == 0 and trust.tower_destination(tower_id).hex() in added.stdout
    assert trust.load(tmp_path / "client.toml").towers == {tower_id: "gpu-box"}
    assert (tmp_path / "client.toml").stat().st_mode & 0o077 == 0
    clash = bare_rngrid("trust", other_id, "--name", "gpu-box", home=tmp_path)
    assert clash.returncode == 1 and "gpu-box" in clash.stderr
    assert bare_rngrid("untrust", tower_id, home=tmp_path).returncode == 0
    assert trust.load(tmp_path / "client.toml").towers == {}
    with pytest.raises(ConfigError):
        trust.trust(tmp_path / "client.toml", other_id, "bad\x1bname")


def test_a_trusted_tower_that_lies_about_its_speed_loses_to_what_the_client_measured(hub):
    models = {"rank-model": default_model_path()}
    honest = hub.start_tower("rank-honest", models=models)
    liar = HostileTower(hub.root, "rank-liar", models, claim={"tokens_per_s": 100000.0}, token_delay=0.12,
                        trusted=True, allow={hub.grid.identity_hash: ["infer"]}, connect=[hub.address]).start()
    hub.towers.append(liar)
    try:
        assert len(hub.grid.caps_full([hub.wait_tower("rank-honest"), hub.wait_tower("rank-liar")], timeout=60)) == 2
        # The client has streamed from the honest tower once (measured), never from the liar (its claim: a prior).
        list(hub.grid.execute("ai/inference", {"model": "rank-model", "prompt": "Count:", "max_tokens": 10,
                                               "temperature": 0.0}, tower="rank-honest"))
        served = []
        for n in range(8):
            pieces = list(hub.grid.execute("ai/inference", {"model": "rank-model", "prompt": f"Count: {n},",
                                                            "max_tokens": 10, "temperature": 0.0}))
            served.append(pieces[-1].tower)
        print(f"served: {served}")
        assert served.count("rank-liar") <= 2 and served[-4:] == ["rank-honest"] * 4, served
    finally:
        honest.stop()
        liar.stop()


def test_the_trust_line_a_tower_prints_is_the_one_that_works(grid3, tmp_path):
    legit = grid3[0]
    line = next(line for line in legit.log().splitlines() if "rngrid trust " in line)
    args = line.split("rngrid ", 1)[1].split()
    assert args[:2] == ["trust", legit.identity_hash] and args[2:] == ["--name", "big-tower"]
    assert bare_rngrid(*args, home=tmp_path).returncode == 0
    assert trust.load(Path(tmp_path) / "client.toml").towers[legit.identity_hash] == "big-tower"


def test_job_notifications_are_known_by_the_trusted_towers_lxmf_address(tmp_path):
    from reticulum_grid.training.notify import delivery_hash
    tower = load_or_create(tmp_path / "t" / "identity")
    trust.trust(tmp_path / "client.toml", tower.hash.hex(), "gpu-box")
    sources = trust.load(tmp_path / "client.toml").lxmf_sources()
    assert sources == {delivery_hash(tower).hex(): "gpu-box"}  # the address its Notifier sends from
