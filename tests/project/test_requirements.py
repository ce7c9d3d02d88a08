"""testbed/requirements.py: a missing dependency skips with its reason and its
install command, the run ends with a list of them, RNGRID_REQUIRE_ALL=1
makes an installable one a failure, and no test skips around it."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testbed import requirements
from testbed.requirements import REQUIRE_ALL_ENV, THINGS, Thing, need

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def absent(monkeypatch):
    """Two made-up requirements this machine lacks: one installable, one hardware."""
    monkeypatch.setitem(THINGS, "absent-tool", Thing(lambda: "the `absent` command is not installed",
                                                     "apt-get install absent"))
    monkeypatch.setitem(THINGS, "absent-board", Thing(lambda: "no such board here", None))
    requirements.missing.cache_clear()
    yield
    requirements.missing.cache_clear()


def test_a_missing_thing_skips_with_its_reason_and_its_install_command(absent, monkeypatch):
    monkeypatch.delenv(REQUIRE_ALL_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        need("absent-tool", "a test of the helper")
    assert str(skipped.value) == ("needs absent-tool (a test of the helper): the `absent` command is not "
                                  "installed; apt-get install absent")


def test_required_runs_fail_for_installable_things_only(absent, monkeypatch):
    monkeypatch.setenv(REQUIRE_ALL_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_ALL_ENV}=1 and a test needs absent-tool"):
        need("absent-tool", "a test of the helper")
    with pytest.raises(pytest.skip.Exception, match="no such board here"):
        need("absent-board", "hardware may still be missing")
    monkeypatch.setenv(REQUIRE_ALL_ENV, "0")
    with pytest.raises(pytest.skip.Exception):
        need("absent-tool", "0 is off")


def test_a_present_thing_does_nothing(monkeypatch):
    monkeypatch.setitem(THINGS, "present", Thing(lambda: None, "nothing to do"))
    requirements.missing.cache_clear()
    monkeypatch.setenv(REQUIRE_ALL_ENV, "1")
    assert need("present", "it is here") is None


SAMPLE = textwrap.dedent("""
    import pytest
    from testbed import requirements
    from testbed.requirements import Thing, need, needs

    requirements.THINGS["absent-tool"] = Thing(lambda: "not installed", "apt-get install absent")

    def test_in_the_body():
        need("absent-tool", "called in the body")

    @needs("absent-tool", "as a marker")
    def test_marked():
        pass

    def test_plain():
        pass
""")


def run_sample(tmp_path, **env):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_ALL_ENV} | env
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "testbed.requirements", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_sample.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)


def test_the_run_ends_with_what_was_missing_and_who_skipped(tmp_path):
    run = run_sample(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:]
    summary = run.stdout.split("skipped for what this machine lacks", 1)[1]
    assert "absent-tool: not installed; apt-get install absent" in summary
    assert re.search(r"test_sample.py::test_in_the_body\n.*test_sample.py::test_marked", summary), summary
    assert "2 test(s) skipped for something the set-up can install" in summary
    assert "1 passed, 2 skipped" in run.stdout


def test_require_all_turns_those_skips_into_failures(tmp_path):
    run = run_sample(tmp_path, **{REQUIRE_ALL_ENV: "1"})
    assert run.returncode == 1, run.stdout[-3000:]
    assert "1 failed, 1 passed, 1 error" in run.stdout, run.stdout[-3000:]  # the marker fails the set-up
    assert "requirements: no test was skipped" in run.stdout


#: Skips that are not about a missing dependency, with why (file: the one allowed line).
OTHER_SKIPS = {"test_rnsfix_unpatched.py": "pytest.skip(f\"unpatched run passed; {UNRELIABLE[node]}\")"}


def test_every_dependency_skip_goes_through_requirements():
    skipping = re.compile(r"pytest\.skip\(|skipif\(|importorskip\(|pytest\.mark\.skip\b|xfail")
    found = []
    for path in sorted(p for folder in ("tests", "testbed") for p in (ROOT / folder).rglob("*.py")):
        if path.name in ("requirements.py", "test_requirements.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if skipping.search(line) and OTHER_SKIPS.get(path.name, "\0") not in line:
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "skip through testbed/requirements.py (need/needs):\n" + "\n".join(found)
