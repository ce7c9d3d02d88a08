"""Strings from the network are printed as text: never rich markup, emoji
codes or terminal escapes (cli/common.py), in every CLI verb and log line.

Real towers served to the real CLI: one named ``[/x]:x:`` (``[/x]`` ends a
style that was never opened, so rich raises MarkupError; ``:x:`` is rich's
emoji code for a cross), and a hostile one (tests/hostile_tower.py) that
answers every probe with an error message holding markup and terminal
escapes (ESC [2J clears a terminal, ESC ] 0 ; ... BEL retitles it). The caps
decoder already refuses names with control characters, so escapes arrive in
messages like these.
"""

import json
from pathlib import Path

import pytest
import tomlkit

from reticulum_grid.node import trust
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import TowerProcess
from reticulum_grid.inference.default_model import default_model_path
from tests.conftest import rngrid
from tests.hostile_tower import HostileTower

DATA = Path(__file__).parent / "data" / "secret.jsonl"
NAME = "[/x]:x:"
ESCAPES = "[/x] \x1b[2J\x1b]0;owned\x07 [bold]gotcha"
SHOWN = "[/x] \\x1b[2J\\x1b]0;owned\\x07 [bold]gotcha"


@pytest.fixture(scope="module")
def hostile(hub, tmp_path_factory):
    home = tmp_path_factory.mktemp("names-cli")
    cli_id = load_or_create(home / "identity").hash.hex()
    named = TowerProcess(hub.root, "hostile-name", {"name-model": default_model_path()},
                         allow={cli_id: ["infer"], hub.grid.identity_hash: ["infer"]}, connect=[hub.address])
    doc = tomlkit.parse(named.config_path.read_text())
    doc["name"] = NAME
    named.config_path.write_text(tomlkit.dumps(doc))
    escapes = HostileTower(hub.root, "hostile-errors", {"name-model": default_model_path()},
                           refuse={path: ESCAPES for path in ("ping", "caps/full", "ai/inference", "jobs/status")},
                           trusted=True, connect=[hub.address])
    hub.towers += [named, escapes]
    named.start()
    escapes.start()
    assert hub.grid.wait_for(lambda _: hub.grid.table.find(NAME), 60), "the tower named [/x] was not heard"
    yield named, escapes, home
    named.stop()
    escapes.stop()


def test_the_tower_itself_survives_its_name(hostile):
    named, _, home = hostile
    rngrid("towers", "--wait", "3", "--connect", named.address, home=home)  # it has announced by now
    assert named.proc.poll() is None, named.log()[-2000:]
    assert f"tower {NAME} serving" in named.log()


def test_towers_lists_names_and_errors_as_text(hostile):
    named, escapes, home = hostile
    table = rngrid("towers", "--wait", "10", "--connect", named.address, home=home)
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr[-2000:]
    assert NAME in table.stdout and "❌" not in table.stdout, table.stdout
    # Alone (no other tower answers first), the hostile tower's refusal is what its row shows.
    table = rngrid("towers", "--wait", "10", "--connect", escapes.address, home=home)
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr[-2000:]
    assert "failed: internal: [/x] \\x1b[2J\\x1b]0;owned\\x07" in table.stdout and "[bold]gotcha" in table.stdout
    assert "\x1b" not in table.stdout + table.stderr and "\x07" not in table.stdout, table.stdout
    rows = json.loads(rngrid("towers", "--json", "--wait", "10", "--connect", named.address, "--connect",
                             escapes.address, home=home).stdout)
    assert {NAME, "hostile-errors"} <= {r["name"] for r in rows}  # JSON carries the text itself, JSON-escaped


def test_infer_reports_the_tower_and_its_errors_as_text(hostile):
    named, escapes, home = hostile
    run = rngrid("infer", "-m", "name-model", "--tower", trust.tower_destination(named.identity_hash).hex(),
                 "--max-tokens", "2", "--raw", "--connect", named.address, "Hi", home=home)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"from {NAME}," in run.stderr and "❌" not in run.stderr
    refused = rngrid("infer", "-m", "name-model", "--tower", "hostile-errors", "--connect", escapes.address, "Hi",
                     home=home)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert SHOWN in refused.stderr and "\x1b" not in refused.stderr, refused.stderr


def test_job_commands_report_errors_as_text(hostile):
    _, escapes, home = hostile
    run = rngrid("jobs", "--tower", "hostile-errors", "--connect", escapes.address, home=home)
    assert run.returncode == 1 and SHOWN in run.stderr and "\x1b" not in run.stderr, run.stderr[-2000:]


def test_log_lines_show_escapes_as_text(hostile):
    _, escapes, home = hostile
    # train --tower auto asks every tower's caps/full and logs the ones that fail, with their message.
    run = rngrid("-v", "train", "--base", "name-model", "--data", str(DATA), "--output", "x", "--connect",
                 escapes.address, home=home)
    assert f"no caps/full from hostile-errors: internal: {SHOWN}" in run.stderr, run.stderr[-3000:]
    assert "\x1b" not in run.stderr and "\x07" not in run.stderr
