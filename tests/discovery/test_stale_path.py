"""A tower that comes back on another port is reached again by a client whose
RNS remembers the old path (real RNS, real towers, the CLI as a user runs it).

The client's home keeps RNS's path table between runs; the tower's second
life listens elsewhere, so the remembered path leads to an interface with
nothing behind it. Two things repair it: the client's discovery ping and path
requests (the tower answers with a fresh announce), and, should those miss,
a Link attempt that fails within its bound drops the stale path
(connection.open_link). Either way the second run must succeed; with
``expire_path`` removed alone this test still passes (checked), because the
discovery ping repairs the path first."""

from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.node.localgrid import TowerProcess, free_port
from tests.conftest import rngrid


def infer(home, *connect):
    args = [a for address in connect for a in ("--connect", address)]
    return rngrid("infer", "-m", DEFAULT_ALIAS, "--tower", "moving-a", "--max-tokens", "4", "--temperature", "0",
                  "--json", *args, "Hello", home=home, timeout=120)


def test_a_tower_back_on_another_port_is_reached_again(hub, tmp_path):
    home = tmp_path / "client"
    spare = f"127.0.0.1:{free_port()}"  # where the tower comes back; nothing listens there yet
    allow = {rngrid("id", home=home).stdout.strip(): ["infer"]}
    first = TowerProcess(hub.root, "moving-a", {DEFAULT_ALIAS: default_model_path()}, allow=allow)
    hub.towers.append(first)
    first.start()
    before = infer(home, first.address, spare)
    assert before.returncode == 0, before.stderr[-2000:]
    first.stop()
    second = TowerProcess(hub.root, "moving-a", {DEFAULT_ALIAS: default_model_path()}, allow=allow)
    picked, second.port = second.address, int(spare.rsplit(":", 1)[1])
    second.config_path.write_text(second.config_path.read_text().replace(picked, spare))
    hub.towers.append(second)
    second.start()
    after = infer(home, first.address, spare)
    assert after.returncode == 0, after.stderr[-2000:]
    assert '"completion_tokens": 4' in after.stdout, after.stdout
