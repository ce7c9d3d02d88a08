"""The docs say what the code says: the front page stays a front page with its
two commands, the generated tables (scripts/docs_tables.py) match the code,
the lists of packages match the packages and pyproject's type check, and every
relative link in README.md, docs/ and the other READMEs reaches a file and a
heading that exist."""

import ast
import re
import tomllib
from pathlib import Path

import pytest

from links.commands import COMMANDS
from scripts import docs_tables
from tests.project.test_layers import ALLOWED

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "rnsconfig" / "README.md",
         ROOT / "clients" / "ts" / "README.md"]
#: The packages of reticulum_grid (folders with an __init__.py).
PACKAGES = sorted(p.parent.name for p in (ROOT / "reticulum_grid").glob("*/__init__.py"))


def page(name):
    return (ROOT / name).read_text()


def generated(name, text):
    """What a page holds between part ``name``'s markers."""
    return text.split(docs_tables.begin(name), 1)[1].split(docs_tables.end(name), 1)[0]


def without_code(text):
    """Markdown with its fenced blocks and code spans blanked (their brackets and # are not markup)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    return {slug(h) for h in re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S),
                                        re.M)}


def test_the_readme_is_a_front_page_with_the_two_commands_first():
    readme = page("README.md")
    assert readme.count("\n") <= 250, "README.md is the front page: the reference goes to docs/"
    first_block = re.search(r"^```sh\n(.*?)^```", readme, re.M | re.S).group(1)
    assert [line.split()[:2] for line in first_block.splitlines()] == [["make", "demo"], ["make", "test"]]


def test_generated_tables_match_the_code():
    assert not docs_tables.stale(), "run: python scripts/docs_tables.py"


def test_the_command_table_is_links_commands():
    table = generated("commands", page("docs/protocol.md"))
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \| (\w+) \| ([^|]+) \|$", table, re.M)
    assert [r[0] for r in rows] == list(COMMANDS)
    for path, roles, audience, summary in rows:
        command = COMMANDS[path]
        assert roles.strip() == (" or ".join(f"`{r}`" for r in command.roles) or "anyone"), path
        assert (audience, summary.strip()) == (command.audience, command.summary), path


def test_the_type_checked_packages_are_pyprojects():
    mypy = tomllib.loads(page("pyproject.toml"))["tool"]["mypy"]
    listed = re.findall(r"^- `([^`]+)`$", generated("mypy", page("docs/development.md")), re.M)
    assert listed == mypy["files"]
    assert all((ROOT / p).exists() for p in listed), "pyproject's mypy files name a folder or module that is gone"


def test_the_layer_table_is_test_layers_rule():
    table = generated("layers", page("docs/architecture.md"))
    rows = dict(re.findall(r"^\| `([\w.]+?)(?:/|\.py)` \| ([^|]+) \|$", table, re.M))
    assert {name: set(re.findall(r"`(\w+)`", uses)) for name, uses in rows.items()} == ALLOWED


def _docstring(path):
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def test_the_top_docstring_names_every_package():
    doc = _docstring(ROOT / "reticulum_grid" / "__init__.py")
    sentence = doc[doc.index("Packages"):].split(".")[0]
    assert sorted(re.findall(r"`?(\w+)`?", sentence.split(":", 1)[1])) == PACKAGES


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_docstring_says_what_it_may_use(package):
    """Its "Uses ..." (or "May use ...") clause names exactly its row of the layer rule."""
    doc = " ".join(_docstring(ROOT / "reticulum_grid" / package / "__init__.py").split())
    found = re.search(r"(?:Uses|May use) (.*?)(?:;|\. |\.$)", doc)
    assert found, f"reticulum_grid/{package}/__init__.py's docstring does not say what it may use"
    named = set(re.findall(r"\b(\w+)\b", found.group(1))) & set(ALLOWED)
    assert named == ALLOWED[package], (package, found.group(0))


def test_the_layout_names_every_package():
    layout = re.search(r"^reticulum_grid/ .*?\n(.*?)^\S", page("docs/architecture.md"), re.S | re.M).group(1)
    assert sorted(re.findall(r"^  (\w+)/ ", layout, re.M)) == PACKAGES


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", without_code(path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        goal = (path.parent / file).resolve() if file else path
        if not goal.exists():
            broken.append(f"{target}: no such file")
        elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
            broken.append(f"{target}: no such heading")
    assert not broken, broken
