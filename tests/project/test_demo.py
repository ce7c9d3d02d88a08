"""The README's first command: `rngrid demo` streams a real answer on loopback,
with the core install alone (what `make demo` installs: no extra)."""

import re
import subprocess
import sys

from tests.project.core_install import core_env, extra_modules


def test_demo_streams_and_reports(tmp_path, reference):
    result = subprocess.run([sys.executable, "-m", "reticulum_grid", "--home", str(tmp_path / "home"), "demo",
                             "--max-tokens", "24", "--prompt", "Say hello.", "--temperature", "0"],
                            capture_output=True, text=True, timeout=300, env=core_env(tmp_path / "core"))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # The model's own answer (greedy, as a fresh llama.cpp context gives it) on stdout, and its figures.
    expected, _, generation = reference.run(24, messages=[{"role": "user", "content": "Say hello."}])
    assert result.stdout.strip() == expected.strip(), (result.stdout, expected)
    report = re.search(r"TTFT \d+ ms \(tower \d+ ms\), [0-9.]+ tokens/s, (\d+) tokens, finish: (\w+)", result.stderr)
    assert report, result.stderr
    assert int(report[1]) == generation.completion_tokens and report[2] == generation.finish_reason, result.stderr
    assert "tower stopped" in result.stderr


def test_the_core_install_lacks_the_extras(tmp_path):
    # What makes the demo's test mean something: the extras' modules are really gone there.
    assert {"starlette", "torch", "faster_whisper"} <= extra_modules()
    blocked = subprocess.run([sys.executable, "-c", "import starlette"], env=core_env(tmp_path),
                             capture_output=True, text=True, timeout=60)
    assert blocked.returncode == 1 and "the core install lacks it" in blocked.stderr, blocked.stderr
