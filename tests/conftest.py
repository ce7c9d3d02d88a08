"""Test harness: real RNS, real model, every tower in its own process.

The test process runs one RNS instance (RNS allows one per process) with a
TCP server on a free loopback port; each tower process connects to it and
listens on its own free port for other clients. Nothing but 127.0.0.1 is used,
RNS never starts with its default config, and every wait is bounded.
"""

import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

import pytest
import tomlkit

# Nothing a test starts (towers, trainer workers) ever asks a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from testbed import leftovers  # noqa: E402

from links.wire import WireError
from reticulum_grid.node import rnsnet
from reticulum_grid.store.blobstore import BlobStore
from reticulum_grid.client import Grid
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.node.localgrid import TowerProcess, free_port, trust_local_towers

logging.basicConfig(level=logging.INFO)
ROOT = Path(__file__).resolve().parent.parent
#: What a test needs beyond the venv: need()/needs(), the skip summary, RNGRID_REQUIRE_ALL.
pytest_plugins = ("testbed.requirements",)


class Hub:
    """The test process's client side: a Grid whose RNS listens on ``address``."""

    def __init__(self, grid, address, root):
        self.grid = grid
        self.address = address
        self.root = root
        self.pooled = []  # towers the whole session shares (pool_tower): no module's end stops them
        self.towers = []

    def start_tower(self, name, models=None, allow=None, roles=("infer",), connect=None, blobs=(), trusted=True,
                    n_ctx=None, **sections):
        """Start a tower process connected to the hub (or to ``connect``); the hub's
        identity gets ``roles`` unless ``allow`` is given. ``blobs``: (path, alias,
        kind, copy) tuples put in the tower's store before it starts; ``n_ctx``: every
        model's context window (tokens). The hub and
        the CLI runs of ``rngrid()`` trust it unless ``trusted`` is False (a stranger)."""
        # Two towers of one name would share a folder, an identity and a store (a pull then met the other's).
        assert name not in {t.name for t in self.towers}, f"a tower {name!r} was started already in this session"
        if allow is None:
            allow = {self.grid.identity_hash: list(roles)}
        models = models if models is not None else {DEFAULT_ALIAS: default_model_path()}
        tower = TowerProcess(self.root, name, models, allow=allow, connect=connect or [self.address],
                             trusted=trusted, **sections)
        if n_ctx is not None:
            doc = tomlkit.parse(tower.config_path.read_text())
            for model in doc["models"].values():
                model["n_ctx"] = n_ctx
            tower.config_path.write_text(tomlkit.dumps(doc))
        store = BlobStore(tower.dir / "blobs")
        for path, alias, kind, copy in blobs:
            store.add_file(path, alias=alias, kind=kind, copy=copy)
        self.towers.append(tower)
        return tower.start()

    def stop_towers(self, towers):
        """Stop ``towers`` (SIGTERM to all, then wait for each) and drop them from the
        hub's table, so no later test routes to a tower that is gone."""
        for tower in towers:
            if tower.proc and tower.proc.poll() is None:
                tower.proc.terminate()
        for tower in towers:
            tower.stop()
            for entry in [*self.grid.table.live(), *self.grid.table.strangers()]:
                if entry.name == tower.name:
                    self.grid.table.remove(entry.destination_hash)

    def tower_identity(self, name):
        """The identity hash (hex) the tower ``name`` will have (created now)."""
        return load_or_create(self.root / name / "identity").hash.hex()

    def wait_tower(self, name, timeout=60.0):
        """The tower table entry for ``name`` once heard (bounded wait)."""
        entry = self.grid.wait_for(lambda _: self.grid.table.find(name), timeout)
        assert entry, f"tower {name} not heard within {timeout} s"
        return entry


def pytest_configure(config):
    leftovers.become_subreaper()
    # Each pytest-xdist worker gets its share of the cores for what its tests start: torch's
    # OpenMP threads spin-wait, and two workers each spinning on every core made a training
    # step 7x slower (20 s against 3 s). Towers run llama.cpp on one thread already.
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


@pytest.hookimpl(trylast=True)  # under pytest-xdist, after its workers have ended
def pytest_sessionfinish(session, exitstatus):
    """Fail the run when any process it started is still alive (then end them).
    An xdist worker leaves the check to the controller: a subreaper, it inherits
    whatever a worker left behind."""
    if hasattr(session.config, "workerinput"):
        return
    left = leftovers.leftovers()
    if left:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        lines = "\n".join(f"  {pid}: {cmd[:200]}" for pid, cmd in left.items())
        session.config.get_terminal_writer().line(f"processes left behind by the tests (now killed):\n{lines}",
                                                  red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_hubs = []  # the session's hub, once a test asked for it


@pytest.fixture(scope="module", autouse=True)
def module_leaves_nothing_behind():
    """Every tower a module started through the hub, in a fixture or a test, stops
    when the module ends, and every blob it put in the hub's own store is removed:
    the next module (whatever a pytest-xdist worker runs next) starts without its
    load, and finds in the hub's store only what was there before."""
    started, held = (len(_hubs[0].towers), _held(_hubs[0])) if _hubs else (0, set())
    yield
    if _hubs:
        _hubs[0].stop_towers([t for t in _hubs[0].towers[started:] if t not in _hubs[0].pooled])
        for name in _held(_hubs[0]) - held:  # a new alias, or a new blob with all its aliases
            with contextlib.suppress(WireError):
                _hubs[0].grid.store.remove(name)


def _held(hub):
    """The aliases and blob ids (hex) in the hub's own store."""
    return {name for info in hub.grid.store.list() for name in (*info.aliases, info.hex)}


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    port = free_port()
    rnsdir = rnsnet.write_config(root / "client" / "rns", listen=f"127.0.0.1:{port}")
    trust_local_towers(root / "client")  # the hub trusts every tower the tests start as trusted
    grid = Grid(home=root / "client", rns_config=rnsdir)
    hub = Hub(grid, f"127.0.0.1:{port}", root)
    _hubs.append(hub)
    yield hub
    grid.close()
    hub.stop_towers(hub.towers)


@pytest.fixture(scope="session")
def pool_tower(hub):
    """One tower per test process serving the default model as POOL_MODEL (embeddings on), for
    modules that only send it requests and read their answers: none may assert on its log, load or
    whole state, which other modules' requests share. A module that does keeps a tower of its own."""
    from tests.gateway_support import POOL_MODEL, start_tower
    tower = start_tower(hub, "pool", POOL_MODEL, roles=("infer", "sync"), settings={"embeddings": True})
    hub.pooled.append(tower)  # it outlives the module that asked for it first (module_leaves_nothing_behind)
    yield tower
    hub.stop_towers([tower])


@pytest.fixture(scope="session")
def pool_gateway(hub, pool_tower):
    """The gateway in this process in front of the pool tower (its URL), with a 30 s busy wait."""
    from tests.gateway_support import serve
    with serve(hub, busy_wait_s=30) as url:
        yield url


@pytest.fixture(scope="module")
def gateway(hub, tower, request):
    """The gateway in this process in front of the module's own ``tower`` fixture (its URL);
    it waits out a busy grid for the module's GATEWAY_BUSY_WAIT_S seconds (the gateway's
    default unless set)."""
    from tests.gateway_support import serve
    with serve(hub, busy_wait_s=getattr(request.module, "GATEWAY_BUSY_WAIT_S", None)) as url:
        yield url


@pytest.fixture(scope="session")
def machine():
    """This machine's hardware as a tower here announces it (node/hardware.py): tests
    compare a tower's backend with it and never assume a CPU."""
    from reticulum_grid.node import hardware
    return hardware.probe()


@pytest.fixture(scope="session")
def model_path():
    return default_model_path()


@pytest.fixture(scope="session")
def reference(model_path, tmp_path_factory):
    """The same GGUF in a runner of its own, every text from a fresh context (tests/reference.py);
    one llama.cpp thread, as every test tower has: spinning thread barriers of runners that share
    the cores (another xdist worker's too) made a 64-token reference take 100 s."""
    from tests.reference import Reference
    ref = Reference(model_path, tmp_path_factory.mktemp("reference") / "runner.log", threads=1)
    yield ref
    ref.close()


@pytest.fixture(scope="session")
def split_reference(model_path, tmp_path_factory):
    """The reference with a split runner's settings (one slot, one thread), one for every split module."""
    from tests.reference import Reference
    ref = Reference(model_path, tmp_path_factory.mktemp("split-reference") / "runner.log", parallel=1, threads=1)
    yield ref
    ref.close()


def rngrid(*args, home, timeout=120, **kwargs):
    """Run the rngrid CLI in a subprocess (its own RNS instance), trusting the
    towers the tests started as trusted (as their user would have)."""
    import subprocess
    trust_local_towers(home, follow=False)
    return subprocess.run([sys.executable, "-m", "reticulum_grid", "--home", str(home), *args],
                          capture_output=True, text=True, timeout=timeout, **kwargs)
