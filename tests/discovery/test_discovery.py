"""Discovery with real RNS: towers announce caps, clients build their table."""

import json

import psutil
import pytest

from announce.announcer import tower_destination_hash
from links.manifest import build
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from reticulum_grid.node.identity import load_or_create
from tests.conftest import rngrid


@pytest.fixture(scope="module")
def two_towers(hub):
    towers = hub.start_tower("disc-a"), hub.start_tower("disc-b")
    yield towers
    hub.stop_towers(towers)


def test_two_towers_discovered_with_correct_caps(hub, two_towers, model_path, machine):
    blob_id = build(model_path).blob_id
    for tower in two_towers:
        entry = hub.wait_tower(tower.name)
        assert entry.destination_hash == tower_destination_hash(load_or_create(tower.dir / "identity"))
        caps = entry.caps
        assert caps.name == tower.name and entry.hops == 1
        model = caps.model(DEFAULT_ALIAS)
        assert model.loaded and model.short_id == blob_id[:4]
        hw = caps.hardware
        assert hw.backend == machine.backend and hw.device and (hw.vram_total_mib == 0) == (hw.backend == "cpu")
        assert abs(hw.ram_total_mib - psutil.virtual_memory().total // 2**20) <= 1
        assert 0 < hw.ram_free_mib <= hw.ram_total_mib
        assert caps.tokens_per_s > 0, "warm-up gives a first tokens/s estimate"
        assert caps.heartbeat_s == 600 and caps.load.streams == 0


def test_caps_full_over_link(hub, two_towers, model_path):
    from announce.caps import decode_full
    entry = hub.wait_tower(two_towers[0].name)
    reply = hub.grid.connection(entry).request("caps/full", {})
    full = decode_full(reply["caps"])
    # Stamped on the tower's clock, later than the announce it follows (the table keeps the later).
    assert full.name == entry.name and entry.caps.at_ms and full.at_ms > entry.caps.at_ms
    (blob,) = reply["blobs"]
    assert blob["alias"] == DEFAULT_ALIAS and blob["blob_id"] == build(model_path).blob_id
    assert blob["kind"] == "model" and blob["loaded"] and blob["size"] > 90 * 2**20


def test_towers_cli_json(two_towers, tmp_path, machine):
    result = rngrid("towers", "--json", "--wait", "20", "--connect", two_towers[0].address, home=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    (row,) = [r for r in rows if r["name"] == two_towers[0].name]
    assert row["models"][0]["alias"] == DEFAULT_ALIAS and row["hops"] == 1
    assert row["backend"] == machine.backend and row["ram_total_mib"] > 0 and len(row["destination"]) == 32


def test_towers_cli_table(two_towers, tmp_path):
    result = rngrid("towers", "--wait", "20", "--connect", two_towers[1].address, home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert two_towers[1].name in result.stdout and DEFAULT_ALIAS in result.stdout
    entry_hash = [line for line in result.stdout.splitlines() if two_towers[1].name in line]
    assert entry_hash, result.stdout


def test_a_returning_client_hears_a_tower_at_once_through_path_requests(hub, tmp_path):
    # The floor keeps this tower from answering discovery pings for 10 minutes:
    # only a path request (answered with live caps) can find it.
    home = tmp_path / "laptop"
    client = load_or_create(home / "identity").hash.hex()
    tower = hub.start_tower("quiet", allow={client: ["infer"]}, announce={"floor_s": 600, "heartbeat_s": 600})
    destination = tower_destination_hash(load_or_create(tower.dir / "identity")).hex()
    first = rngrid("infer", "-m", DEFAULT_ALIAS, "--tower", destination, "--max-tokens", "2", "--json",
                   "--connect", tower.address, "Hi", home=home)
    assert first.returncode == 0 and '"usage"' in first.stdout, first.stderr
    again = rngrid("towers", "--json", "--wait", "10", "--connect", tower.address, home=home)
    assert again.returncode == 0, again.stderr
    rows = [r for r in json.loads(again.stdout) if r["destination"] == destination]
    assert rows and rows[0]["models"][0]["alias"] == DEFAULT_ALIAS


def test_a_model_no_tower_has_is_refused_naming_what_was_heard(two_towers, tmp_path):
    result = rngrid("route", "-m", "smolm2-135m", "--connect", two_towers[0].address, home=tmp_path)
    assert result.returncode == 1 and "unknown_model: no tower with model 'smolm2-135m'" in result.stderr
    assert f"{two_towers[0].name} ({DEFAULT_ALIAS})" in result.stderr, result.stderr
