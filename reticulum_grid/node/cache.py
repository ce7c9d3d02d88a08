"""Where rngrid keeps what it can make again (joined speech models, converted
training bases): ``RNGRID_CACHE``, else ``~/.cache/rngrid``. The llama.cpp
build (scripts/llama_build.py) keeps its own under the same default."""

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache folder (not created here)."""
    return Path(os.environ.get("RNGRID_CACHE") or Path.home() / ".cache" / "rngrid")
