"""The layering: imports run downward only, never sideways into a package
beside or above, and `announce`/`links` never import the application.
``ALLOWED`` is the rule itself; docs/architecture.md's table is made from it
(scripts/docs_tables.py) and each package's docstring names its row
(tests/project/test_docs.py)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What each package of reticulum_grid may import from reticulum_grid (besides itself).
ALLOWED = {
    "node": set(),
    "store": {"node"},
    "inference": {"store", "node"},
    "training": {"store", "node"},
    "split": {"inference", "store", "node"},
    "voice": {"inference", "node"},
    "tower": {"split", "inference", "training", "voice", "store", "node"},
    "client": {"split", "training", "voice", "store", "node"},
    "gateway": {"client", "training", "voice", "store", "node"},
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


#: The folders outside the product, each with what it must never import: the product
#: ships alone (pyproject's packages.find), and testbed/ is what tests/ and bench/
#: share, so it stands below both.
NEVER_IMPORTS = {
    "reticulum_grid": {"testbed", "tests", "bench"},
    "announce": {"testbed", "tests", "bench"},
    "links": {"testbed", "tests", "bench"},
    "testbed": {"tests", "bench"},
}


def test_product_and_testbed_never_import_what_stands_above_them():
    wrong = [f"{path.relative_to(ROOT)} imports {module}"
             for folder, banned in NEVER_IMPORTS.items() for path in (ROOT / folder).rglob("*.py")
             for module in _imports(path) if module.split(".")[0] in banned]
    assert not wrong, "\n".join(wrong)


def test_testbed_is_not_shipped():
    import tomllib
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert not any("testbed".startswith(p.rstrip("*")) for p in found["include"]), found


#: Lines a module of the product (or of testbed/, scripts/ or bench/) may have: past it, a file holds more than one idea;
#: cut it where the ideas part, not where the count says.
MAX_LINES = 420


def test_no_product_module_over_max_lines():
    long = [f"{p.relative_to(ROOT)}: {n}" for folder in ("reticulum_grid", "announce", "links", "testbed", "scripts", "bench")
            for p in (ROOT / folder).rglob("*.py") if (n := p.read_text().count("\n")) > MAX_LINES]
    assert not long, f"over {MAX_LINES} lines:\n" + "\n".join(long)


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """{module: modules of the project (and of testbed/) it imports}, every import counted:
    top-level, inside functions and under TYPE_CHECKING alike (a circle of
    type hints is still a circle to a reader). A package's __init__ is left
    out: it only hands names on."""
    paths = {_module_name(p): p for folder in ("reticulum_grid", "links", "announce", "testbed")
             for p in (ROOT / folder).rglob("*.py") if p.name != "__init__.py"}
    graph = {}
    for name, path in paths.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                edges.update(t for t in (node.module, *(f"{node.module}.{a.name}" for a in node.names)) if t in paths)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in paths)
        graph[name] = edges - {name}
    return graph


def circles(graph):
    """The strongly connected groups of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_circles_are_found():
    # What the test below relies on: a loop through a function-level import is seen.
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_round_a_circle():
    assert not circles(import_graph()), circles(import_graph())
