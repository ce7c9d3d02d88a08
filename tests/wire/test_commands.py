"""One table of commands (links/commands.py), and everything that lists or
serves them agreeing with it: the tower's capabilities, the client's resend
rule, Grid.execute, /v1/grid/execute, `rngrid execute` and `rngrid allow`'s
help, the docs (docs/protocol.md, cli.md, http-api.md) and the TypeScript
client. Adding a command in one place and not the others fails here, naming
what is missing."""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from links import commands
from links.commands import COMMANDS, Command, bind
from links.wire import Code, WireError
from reticulum_grid.cli import main
from reticulum_grid.client import Grid
from reticulum_grid.gateway import commands as gateway
from reticulum_grid.tower.blobs import TowerBlobs
from reticulum_grid.tower.daemon import Tower, merge_commands
from reticulum_grid.tower.dp import TowerDP
from reticulum_grid.tower.inference import TowerInference
from reticulum_grid.tower.jobs import TowerJobs
from reticulum_grid.tower.shard import TowerShard
from reticulum_grid.tower.split import TowerSplit
from reticulum_grid.tower.voice import TowerVoice

ROOT = Path(__file__).resolve().parents[2]
USER = [c.path for c in commands.of(commands.USER)]


def bare(cls, **attrs):
    """An instance of ``cls`` without running its __init__ (no RNS, no models):
    enough to ask what it declares."""
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def declared():
    """Each capability's ``commands()``, as a tower merges them."""
    jobs = bare(TowerJobs, dp=bare(TowerDP))
    return [bare(Tower)._commands(), jobs.commands(),
            *(bare(cls).commands() for cls in (TowerInference, TowerVoice, TowerBlobs, TowerSplit,
                                                       TowerShard))]


def test_the_towers_capabilities_serve_the_table_exactly():
    served = merge_commands(*declared())
    assert list(sorted(served)) == sorted(COMMANDS)
    assert all(callable(c.handler) for c in served.values())


@pytest.mark.parametrize("groups, words", [
    ([[bind("ping", dict)], [bind("ping", dict)]], "declared twice"),
    ([[Command("no/such", None, "x").bind(dict)]], "links/commands.py"),
    ([[COMMANDS["ping"]]], "no handler"),
    ([[bind("ping", dict)]], "no capability serves caps/full"),
])
def test_merging_refuses_what_does_not_match_the_table(groups, words):
    with pytest.raises(ValueError, match=words):
        merge_commands(*groups)


def test_what_a_client_resends_comes_from_the_table():
    assert commands.ANSWERED_ONCE == {"ai/inference": "stream_id", "genome/train": "submit_id",
                                      "audio/transcribe": "stream_id", "audio/speech": "stream_id"}
    assert set(commands.ANSWERED_ONCE) <= commands.RESENDABLE
    assert {"ping", "caps/full", "blobs/manifest", "jobs/status"} <= commands.RESENDABLE
    assert not {"blobs/push", "blobs/pull", "jobs/cancel", "train/join", "shard/tunnel"} & commands.RESENDABLE


def test_grid_execute_reaches_every_command_of_the_table_and_no_other():
    grid = bare(Grid)  # both answers come before anything is sent
    with pytest.raises(WireError) as e:
        grid.execute("no/such", {})
    assert e.value.code == Code.BAD_REQUEST and all(path in e.value.message for path in COMMANDS)
    for path in set(COMMANDS) - {"ai/inference", "ai/embeddings", "audio/transcribe", "audio/speech"}:
        with pytest.raises(WireError, match="needs a tower"):
            grid.execute(path, {})


def test_the_gateway_runs_every_user_command():
    known = gateway.known()
    assert known == USER + list(gateway.LOCAL)
    assert set(gateway.WORK) <= set(known), set(gateway.WORK) - set(known)
    described = gateway.__doc__
    assert not [p for p in known if f"``{p}``" not in described], "gateway/commands.py's docstring lacks them"


def test_rngrid_execute_lists_every_command_and_allow_every_role():
    listed = CliRunner().invoke(main, ["execute", "--help"]).output
    assert not [p for p in gateway.known() if p not in listed], listed
    roles = " ".join(CliRunner().invoke(main, ["allow", "--help"]).output.split())
    for role, paths in commands.by_role().items():
        assert f"{role}: {', '.join(paths)}" in roles, (role, roles)


def test_the_docs_list_every_command():
    protocol = (ROOT / "docs" / "protocol.md").read_text()
    section = protocol[protocol.index("## Every command"):]
    rows = dict(re.findall(r"^\| `([a-z]+/?[a-z]*)` \| ([^|]+) \|", section, re.M))
    assert list(rows) == list(COMMANDS), f"docs/protocol.md's command table != links/commands.py: {list(rows)}"
    for path, role in rows.items():
        wanted = " or ".join(f"`{r}`" for r in COMMANDS[path].roles) or "anyone"
        assert role.strip() == wanted, (path, role)
    http = (ROOT / "docs" / "http-api.md").read_text()
    execute = http[http.index("`POST /v1/grid/execute`"):][:800]
    cli = (ROOT / "docs" / "cli.md").read_text()
    row = next(line for line in cli.splitlines() if line.startswith("| `rngrid execute"))
    assert not [p for p in gateway.known() if f"`{p}`" not in execute or f"`{p}`" not in row]


def test_the_typescript_client_knows_every_command():
    types = (ROOT / "clients" / "ts" / "index.d.ts").read_text()
    mapped = re.findall(r'^  "([a-z]+/[a-z]+)": \{ params', types[types.index("interface CommandMap"):], re.M)
    assert sorted(mapped) == sorted(gateway.known()), "clients/ts/index.d.ts CommandMap differs"


class EchoConnection:
    """Test double: a tower connection answering any request with what it was sent."""

    def __init__(self, sent):
        self.sent = sent

    def request(self, path, payload, timeout=30.0):
        self.sent.append((path, payload))
        return {"path": path, "echo": payload}


class EchoGrid:
    """Test double: what ``rngrid execute`` and the gateway need of a Grid, its
    ``execute`` the real one over EchoConnection."""

    def __init__(self, sent):
        self.grid = bare(Grid, find_tower=lambda name, timeout=15.0: name,
                         connection=lambda entry: EchoConnection(sent))

    def execute(self, *args, **kwargs):
        return self.grid.execute(*args, **kwargs)

    def close(self):
        pass


@pytest.fixture
def new_command(monkeypatch):
    """A user command added to links/commands.py's table only, as a new capability would add it."""
    added = Command("demo/echo", "infer", "answer what it is sent")
    monkeypatch.setattr(commands, "_TABLE", commands._TABLE + (added,))
    monkeypatch.setitem(COMMANDS, added.path, added)
    return added


def test_a_command_added_to_the_table_is_reachable_from_python_the_gateway_and_the_cli(new_command, monkeypatch):
    sent = []
    grid = EchoGrid(sent)
    assert grid.execute("demo/echo", {"n": 1}, tower="t")["echo"] == {"n": 1}  # Grid.execute
    events = []
    gateway.work_for(grid, None, "demo/echo", {"n": 2, "tower": "t"}, 0.0)(
        type("Call", (), {"emit": staticmethod(events.append)})())  # /v1/grid/execute's work
    assert events == [{"type": "result", "reply": {"path": "demo/echo", "echo": {"n": 2}}}]
    from reticulum_grid.cli import execute as cli_execute
    monkeypatch.setattr(cli_execute, "open_grid", lambda ctx, connect, rns_config: grid)
    assert "demo/echo" in CliRunner().invoke(main, ["execute", "--help"]).output
    ran = CliRunner().invoke(main, ["execute", "demo/echo", '{"n": 3}', "--tower", "t"])
    assert ran.exit_code == 0 and '"echo": {"n": 3}' in ran.output, ran.output
    assert sent == [("demo/echo", {"n": 1}), ("demo/echo", {"n": 2}), ("demo/echo", {"n": 3})]
    with pytest.raises(ValueError, match="no capability serves demo/echo"):
        merge_commands(*declared())  # and a tower refuses to start until a capability serves it
