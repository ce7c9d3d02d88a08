"""The layering: imports run downward only, never sideways into a package
beside or above, and `announce`/`links` never import the application.
``ALLOWED`` is the rule itself; docs/architecture.md's table is made from it
(scripts/docs_tables.py) and each package's docstring names its row
(tests/test_docs.py)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What each package of reticulum_grid may import from reticulum_grid (besides itself).
ALLOWED = {
    "node": set(),
    "store": {"node"},
    "inference": {"store", "node"},
    "training": {"store", "node"},
    "split": {"inference", "store", "node"},
    "voice": {"inference", "node"},
    "tower": {"split", "inference", "training", "voice", "store", "node"},
    "client": {"split", "voice", "store", "node"},
    "gateway": {"client", "voice", "store", "node"},
    "demo": {"client", "inference", "node"},
    "cli": {"gateway", "tower", "client", "demo", "split", "inference", "training", "voice", "store", "node"},
    "__main__": {"cli"},
    "__init__": {"client"},
}


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _package(path):
    parts = path.relative_to(ROOT / "reticulum_grid").parts
    return parts[0] if len(parts) > 1 else parts[0][:-3]


def test_application_imports_run_downward():
    wrong = []
    for path in (ROOT / "reticulum_grid").rglob("*.py"):
        pkg = _package(path)
        assert pkg in ALLOWED, f"{pkg} is a new package: give it a row in ALLOWED, then run scripts/docs_tables.py"
        for module in _imports(path):
            parts = module.split(".")
            if parts[0] == "reticulum_grid" and len(parts) > 1 and parts[1] != pkg and parts[1] not in ALLOWED[pkg]:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_wire_packages_never_import_the_application():
    wrong = [f"{path.relative_to(ROOT)} imports {module}"
             for folder in ("announce", "links") for path in (ROOT / folder).rglob("*.py")
             for module in _imports(path) if module.split(".")[0] == "reticulum_grid"]
    assert not wrong, "\n".join(wrong)


def test_no_module_over_400_lines():
    long = [f"{p.relative_to(ROOT)}: {n}" for folder in ("reticulum_grid", "announce", "links")
            for p in (ROOT / folder).rglob("*.py") if (n := p.read_text().count("\n")) > 420]
    assert not long, "\n".join(long)
