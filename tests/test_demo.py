"""The README's first command: `rngrid demo` streams a real answer on loopback."""

import subprocess
import sys


def test_demo_streams_and_reports(tmp_path):
    result = subprocess.run([sys.executable, "-m", "reticulum_grid", "--home", str(tmp_path), "demo",
                             "--max-tokens", "24", "--prompt", "Say hello."],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "the answer goes to stdout"
    assert "TTFT" in result.stderr and "tokens/s" in result.stderr and "tower stopped" in result.stderr
    assert "Traceback" not in result.stderr
