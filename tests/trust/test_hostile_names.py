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

import pytest
import tomlkit

from reticulum_grid.cli.common import visible
from reticulum_grid.node import config, trust
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import TowerProcess
from reticulum_grid.inference.default_model import default_model_path
from tests.conftest import rngrid
from tests.hostile_tower import HostileTower
from testbed import SECRET_DATASET as DATA

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


# -- names with control or invisible characters ---------------------------------------------------------------

#: What a name may not hold: ESC, zero-width space, word joiner, right-to-left override, a Hangul filler.
UNSEEN = {"a\x1b[2Jb": "U+001B", "ev\u200bil": "U+200B", "ev\u2060il": "U+2060", "a\u202eb": "U+202E",
          "\u3164": "U+3164"}
#: An announced name (the hostile tower lies past its config): zero-width space, word joiner, DEL, C1 CSI.
HEARD = "ze\u200bro\u2060\x7f\x9b"
HEARD_SHOWN = "ze\\u200bro\\u2060\\x7f\\x9b"


@pytest.mark.parametrize("name", UNSEEN)
def test_a_tower_name_that_does_not_show_as_itself_is_refused_at_config_load(tmp_path, name):
    path = tmp_path / "tower.toml"
    config.write_tower(path, name, {})
    with pytest.raises(config.ConfigError) as refused:
        config.load_tower(path)
    assert UNSEEN[name] in str(refused.value) and "invisible" in str(refused.value)
    with pytest.raises(config.ConfigError):
        trust.check_name(name)  # nor can a client record it as a tower's name


def test_the_tower_refuses_to_start_with_such_a_name_and_says_why(tmp_path):
    path = tmp_path / "tower.toml"
    config.write_tower(path, "ev\u200bil\x1b", {})
    run = rngrid("tower", "--config", str(path), home=tmp_path, timeout=60)
    assert run.returncode == 1 and "U+001B, U+200B" in run.stderr, run.stderr[-2000:]
    assert "\x1b" not in run.stderr and "\u200b" not in run.stderr


def test_kept_names_and_emoji_sequences_show_as_they_are(tmp_path):
    for i, name in enumerate(("big-tower", "tour-été", "塔", "tower ☕")):
        config.write_tower(tmp_path / f"{i}.toml", name, {})
        assert config.load_tower(tmp_path / f"{i}.toml").name == name and visible(name) == name
    assert visible("coder \U0001f469\u200d\U0001f4bb") == "coder \U0001f469\u200d\U0001f4bb"  # one emoji: kept
    assert visible("a\u200db") == "a\\u200db" and visible("\U000e0041") == "\\U000e0041"


@pytest.fixture(scope="module")
def heard(hub, tmp_path_factory):
    home = tmp_path_factory.mktemp("names-heard")
    tower = HostileTower(hub.root, "hostile-unseen", {}, claim={"name": HEARD}, trusted=True, connect=[hub.address])
    hub.towers.append(tower)
    tower.start()
    yield tower, home
    tower.stop()


def test_a_heard_name_with_invisible_characters_is_shown_escaped(heard):
    tower, home = heard
    table = rngrid("towers", "--wait", "10", "--connect", tower.address, home=home)
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr[-2000:]
    assert HEARD_SHOWN in table.stdout, table.stdout
    assert not {"\u200b", "\u2060", "\x7f", "\x9b"} & set(table.stdout + table.stderr), table.stdout
