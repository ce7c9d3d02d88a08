"""Default deny: unknown and unidentified clients get an explicit refusal."""

import threading
import time

import pytest

from announce.announcer import APP_NAME, TOWER_ASPECT
from links import protocol, wire
from links.wire import Code, WireError
from reticulum_grid.node.connection import TowerConnection, open_link
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from tests.conftest import rngrid


@pytest.fixture(scope="module")
def tower(hub):
    t = hub.start_tower("auth-a")
    hub.wait_tower(t.name)
    yield t
    hub.stop_towers([t])


def test_unknown_identity_refused_explicitly(tower, tmp_path):
    started = time.monotonic()
    result = rngrid("infer", "--connect", tower.address, "-m", DEFAULT_ALIAS, "hello", home=tmp_path)
    elapsed = time.monotonic() - started
    client_id = rngrid("id", home=tmp_path).stdout.strip()
    assert result.returncode == 1
    assert "not_allowed" in result.stderr and client_id in result.stderr and "rngrid allow" in result.stderr
    assert f"identity {client_id} is not on this tower's allow-list" in result.stderr
    print(f"refused after {elapsed:.1f} s: {result.stderr.strip()}")


def test_allow_takes_effect_without_restart(tower, tmp_path):
    client_id = rngrid("id", home=tmp_path).stdout.strip()
    granted = rngrid("allow", client_id, "--role", "infer", "--config", str(tower.config_path), home=tmp_path)
    assert granted.returncode == 0, granted.stderr
    result = rngrid("infer", "--connect", tower.address, "-m", DEFAULT_ALIAS, "--max-tokens", "5", "--json",
                    "hello", home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"usage"' in result.stdout.splitlines()[-1]


def test_role_without_infer_refused(hub, tower, tmp_path):
    client_id = rngrid("id", home=tmp_path).stdout.strip()
    granted = rngrid("allow", client_id, "--role", "sync", "--config", str(tower.config_path), home=tmp_path)
    assert granted.returncode == 0, granted.stderr
    # The grant took effect on the tower (it reports the role to that identity) before the refusal counts.
    conn = TowerConnection(load_or_create(tmp_path / "identity"), hub.wait_tower(tower.name).destination_hash, "me")
    try:
        assert conn.request("caps/full", {})["you"] == {"identity": client_id, "roles": ["sync"]}
    finally:
        conn.close()
    result = rngrid("infer", "--connect", tower.address, "-m", DEFAULT_ALIAS, "hello", home=tmp_path)
    assert result.returncode == 1 and f"identity {client_id} is not allowed to infer" in result.stderr
    assert "(it may: sync)" in result.stderr and "not on this tower's allow-list" not in result.stderr


def test_unidentified_link_refused_but_gets_public_caps(hub, tower):
    link = open_link(hub.wait_tower(tower.name).destination_hash, APP_NAME, TOWER_ASPECT)
    try:
        replies = {}
        for path, payload in (("caps/full", {}), ("ai/inference", {"model": DEFAULT_ALIAS, "prompt": "x", "stream_id": 1})):
            done = threading.Event()
            link.request(path, wire.pack(protocol.stamp(payload)), timeout=15,
                         response_callback=lambda r, p=path: (replies.setdefault(p, r.response), done.set()),
                         failed_callback=lambda _: done.set())
            assert done.wait(16) and path in replies, f"{path} got no answer"
        assert wire.parse_response(replies["caps/full"])["blobs"][0]["alias"] == DEFAULT_ALIAS
        with pytest.raises(WireError) as e:
            wire.parse_response(replies["ai/inference"])
        assert e.value.code == Code.NOT_ALLOWED and "not identified" in e.value.message
    finally:
        link.teardown()


def test_revoke_takes_effect_without_restart(tower, tmp_path):
    client_id = rngrid("id", home=tmp_path).stdout.strip()
    assert rngrid("allow", client_id, "--role", "infer", "--config", str(tower.config_path),
                  home=tmp_path).returncode == 0
    assert rngrid("infer", "--connect", tower.address, "-m", DEFAULT_ALIAS, "--max-tokens", "3", "hi",
                  home=tmp_path).returncode == 0  # the grant took effect
    revoked = rngrid("revoke", client_id, "--config", str(tower.config_path), home=tmp_path)
    assert revoked.returncode == 0 and "removed" in revoked.stdout
    result = rngrid("infer", "--connect", tower.address, "-m", DEFAULT_ALIAS, "hi", home=tmp_path)
    assert result.returncode == 1 and f"identity {client_id} is not on this tower's allow-list" in result.stderr
