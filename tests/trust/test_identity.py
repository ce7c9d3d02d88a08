"""Identities persist: a tower keeps its address; a broken identity file stops start-up."""

import subprocess
import sys

import pytest

from reticulum_grid.node.identity import IdentityError, load_or_create
from tests.conftest import rngrid


def test_created_once_and_reloaded(tmp_path):
    a = load_or_create(tmp_path / "identity")
    assert (tmp_path / "identity").stat().st_mode & 0o777 == 0o600
    assert load_or_create(tmp_path / "identity").hash == a.hash


@pytest.mark.parametrize("content", [b"", b"short", b"\x00" * 63, b"x" * 200])
def test_unreadable_identity_is_an_error_and_left_alone(tmp_path, content):
    (tmp_path / "identity").write_bytes(content)
    with pytest.raises(IdentityError, match="refusing to start with a new identity"):
        load_or_create(tmp_path / "identity")
    assert (tmp_path / "identity").read_bytes() == content


def test_tower_keeps_its_destination_across_restart(hub):
    tower = hub.start_tower("ident-a")
    first = hub.wait_tower(tower.name).destination_hash
    tower.stop()
    hub.grid.table.remove(first)
    tower.start()
    assert hub.wait_tower(tower.name).destination_hash == first


def test_tower_with_corrupt_identity_refuses_to_start(hub, tmp_path):
    from reticulum_grid.node.localgrid import TowerProcess
    tower = TowerProcess(tmp_path, "corrupt", {})
    (tower.dir / "identity").write_bytes(b"garbage")
    result = subprocess.run([sys.executable, "-m", "reticulum_grid", "tower", "--config", str(tower.config_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "not a valid RNS identity" in result.stderr
    assert (tower.dir / "identity").read_bytes() == b"garbage"


def test_cli_id_is_stable(tmp_path):
    first = rngrid("id", home=tmp_path).stdout.strip()
    assert len(first) == 32 and rngrid("id", home=tmp_path).stdout.strip() == first


def test_cli_id_of_a_tower(hub, tmp_path):
    from announce.announcer import tower_destination_hash
    from reticulum_grid.node.localgrid import TowerProcess
    tower = TowerProcess(tmp_path, "idt", {})
    out = rngrid("id", "--config", str(tower.config_path), home=tmp_path).stdout
    ident = load_or_create(tower.dir / "identity")
    assert f"identity    {ident.hash.hex()}" in out
    assert f"destination {tower_destination_hash(ident).hex()}" in out
