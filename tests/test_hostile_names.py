"""Strings from the network are printed as text: never rich markup, emoji
codes or terminal escapes (cli/common.py), in every CLI verb and log line.

A real tower whose name is rich markup and a terminal escape (``[/x]`` ends a
style that was never opened: rich raises MarkupError; ESC [2J clears a
terminal), served to the real CLI.
"""

import json

import pytest
import tomlkit

from reticulum_grid.node import trust
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import TowerProcess
from reticulum_grid.inference.default_model import default_model_path
from tests.conftest import rngrid

NAME = "[/x]\x1b[2J:x:"
SHOWN = "[/x]\\x1b[2J:x:"


@pytest.fixture(scope="module")
def hostile(hub, tmp_path_factory):
    home = tmp_path_factory.mktemp("names-cli")
    cli_id = load_or_create(home / "identity").hash.hex()
    tower = TowerProcess(hub.root, "hostile-name", {"name-model": default_model_path()},
                         allow={cli_id: ["infer"], hub.grid.identity_hash: ["infer"]}, connect=[hub.address])
    doc = tomlkit.parse(tower.config_path.read_text())
    doc["name"] = NAME
    tower.config_path.write_text(tomlkit.dumps(doc))
    hub.towers.append(tower)
    tower.start()
    hub.grid.wait_for(lambda _: hub.grid.table.find(NAME), 60)
    yield tower, home
    tower.stop()


def test_the_tower_itself_survives_its_name(hostile):
    tower, _ = hostile
    rngrid("towers", "--wait", "3", "--connect", tower.address, home=hostile[1])  # it has announced by now
    assert tower.proc.poll() is None, tower.log()[-2000:]
    log = tower.log()
    assert SHOWN in log and "\x1b" not in log, log[-2000:]


def test_towers_lists_it_as_text(hostile):
    tower, home = hostile
    table = rngrid("towers", "--wait", "10", "--connect", tower.address, home=home)
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr[-2000:]
    assert SHOWN in table.stdout and "\x1b" not in table.stdout + table.stderr
    rows = json.loads(rngrid("towers", "--json", "--wait", "10", "--connect", tower.address, home=home).stdout)
    assert NAME in [r["name"] for r in rows]  # JSON carries the name itself, escaped by JSON


def test_infer_on_it_reports_it_as_text(hostile):
    tower, home = hostile
    destination = trust.tower_destination(tower.identity_hash).hex()
    run = rngrid("infer", "-m", "name-model", "--tower", destination, "--max-tokens", "2", "--raw",
                 "--connect", tower.address, "Hi", home=home)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"from {SHOWN}" in run.stderr and "\x1b" not in run.stderr + run.stdout


def test_an_error_naming_it_is_text(hostile, tmp_path):
    tower, _ = hostile
    run = rngrid("infer", "-m", "no-such-model", "--connect", tower.address, "Hi", home=tmp_path)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert SHOWN in run.stderr and "\x1b" not in run.stderr
