"""The core install (``pip install -e .``, what ``make demo`` installs) as a
process environment: the modules that only the extras (train, voice,
gateway) bring cannot be imported there, in the process and in every tower
it starts, so a test shows that a command works without them.

The blocked modules come from the installed metadata: the top-level modules of
every distribution the extras need, transitively, that the core dependencies
do not need too (numpy, for one, comes with gguf).
"""

import importlib.metadata as metadata
import os

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

EXTRAS = ("train", "voice", "gateway")
#: Part of every venv's start-up, whatever the project needs.
NEVER_BLOCKED = {"_distutils_hack", "setuptools", "pkg_resources", "pip"}

SITECUSTOMIZE = '''import sys

BLOCKED = {blocked!r}


class CoreInstall:
    """Import hook: a module of the extras is missing, as in the core install."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (the core install lacks it)", name=name)
        return None


sys.meta_path.insert(0, CoreInstall())
'''


def _closure(names):
    seen, todo = set(), list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [r.name for r in map(Requirement, requires) if r.marker is None or r.marker.evaluate({"extra": ""})]
    return seen


def extra_modules():
    """Top-level module names that only the extras bring."""
    own = [Requirement(r) for r in metadata.requires("reticulum-grid") or []]
    core = _closure(r.name for r in own if r.marker is None)
    extra = _closure(r.name for r in own
                     if r.marker is not None and any(r.marker.evaluate({"extra": e}) for e in EXTRAS)) - core
    return {module for module, dists in metadata.packages_distributions().items()
            if any(canonicalize_name(d) in extra for d in dists)} - NEVER_BLOCKED


def core_env(folder):
    """os.environ for a process (and its children) that sees the core install
    only: a sitecustomize.py in ``folder`` goes first on PYTHONPATH."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=sorted(extra_modules())))
    path = [str(folder), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
