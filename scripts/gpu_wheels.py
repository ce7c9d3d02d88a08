"""The wheels a lent GPU machine lacks: which, for which interpreter, and from where.

That machine (CPython 3.12 on x86-64 Linux; scripts/gpu_image_packages.txt
lists the Python packages its image holds) reaches no package index, so
scripts/gpu_pack.py carries a wheel of every runtime dependency of this
project the image lacks, and of their dependencies in turn (``needed``), at
the versions installed here, and a wheel of the project itself. Requirements
and wheel tags are judged for that interpreter, not for the one running this.
Wheels are downloaded once into ``~/.cache/rngrid/gpu-wheels``
(``RNGRID_WHEEL_CACHE`` moves it); ``fetch_wheel(..., offline=True)`` takes
them from there only and never touches a network.
"""

import email.parser
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parent.parent
IMAGE_PACKAGES = ROOT / "scripts" / "gpu_image_packages.txt"
#: The GPU machine's interpreter and platform.
PYTHON = (3, 12)
#: glibc 2.17 to 2.39, the oldest first: pip prefers the platforms named first, and a wheel
#: for an older glibc runs on more machines.
GLIBC_MINORS = range(17, 40)
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in GLIBC_MINORS]
#: Marker values of that interpreter (requirements are evaluated for it, not for this one).
MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": "x86_64", "os_name": "posix", "extra": ""}


def image_packages(path=IMAGE_PACKAGES):
    """The canonical names of the Python packages the GPU machine's image holds."""
    names = set()
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonicalize_name(line))
    return names


def runtime_requirements(pyproject=ROOT / "pyproject.toml"):
    """[Requirement] of the project's runtime dependencies (pyproject's ``dependencies``)."""
    return [Requirement(r) for r in tomllib.loads(Path(pyproject).read_text())["project"]["dependencies"]]


def applies(requirement):
    """True when ``requirement`` holds on the GPU machine's interpreter (no extras)."""
    return requirement.marker is None or requirement.marker.evaluate(MARKERS)


def needed(requirements, image, requires_of):
    """[(name, requirement, needed_by)] that the GPU machine lacks: ``requirements``
    whose names are not in ``image``, then (``requires_of(name)`` -> [Requirement])
    theirs, depth first, each name once. ``needed_by`` is "project" or the
    dependent's name."""
    out, seen = [], set()
    stack = [(r, "project") for r in reversed(requirements)]
    while stack:
        requirement, parent = stack.pop()
        name = canonicalize_name(requirement.name)
        if not applies(requirement) or name in image or name in seen:
            continue
        seen.add(name)
        out.append((name, requirement, parent))
        stack.extend((r, name) for r in reversed(requires_of(name)))
    return out


def installed_requires(name):
    """The requirements of the distribution ``name`` installed here."""
    import importlib.metadata as md
    return [Requirement(r) for r in md.distribution(name).requires or ()]


def installed_version(name):
    import importlib.metadata as md
    try:
        return md.distribution(name).version
    except md.PackageNotFoundError:
        raise SystemExit(f"{name} is not installed in {sys.prefix}: run make setup, then make gpu-pack") from None


def target_tags():
    """The wheel tags the GPU machine's pip accepts."""
    tags = list(cpython_tags(PYTHON, abis=[f"cp{PYTHON[0]}{PYTHON[1]}", "abi3", "none"], platforms=PLATFORMS))
    tags += list(compatible_tags(PYTHON, f"cp{PYTHON[0]}{PYTHON[1]}", PLATFORMS))
    return set(tags)


def wheel_fits(filename, tags=None):
    """True when the wheel ``filename`` installs on the GPU machine."""
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except ValueError:
        return False
    return bool(set(wheel_tags) & (tags or target_tags()))


def wheel_metadata(path):
    """(canonical name, version, [Requirement]) from a wheel's METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        msg = email.parser.Parser().parsestr(z.read(meta).decode("utf-8"))
    return canonicalize_name(msg["Name"]), msg["Version"], [Requirement(r) for r in msg.get_all("Requires-Dist") or ()]


def wheel_cache():
    return Path(os.environ.get("RNGRID_WHEEL_CACHE") or Path.home() / ".cache" / "rngrid" / "gpu-wheels")


def cached_wheel(cache, name, version):
    """A wheel of ``name`` ``version`` in ``cache`` that fits the GPU machine, or None."""
    tags = target_tags()
    for path in sorted(Path(cache).glob("*.whl")) if Path(cache).is_dir() else ():
        try:
            wname, wversion, _, _ = parse_wheel_filename(path.name)
        except ValueError:
            continue
        if wname == name and str(wversion) == version and wheel_fits(path.name, tags):
            return path
    return None


def fetch_wheel(cache, name, version, offline):
    """The wheel of ``name`` ``version`` for the GPU machine: from ``cache``, or
    downloaded into it by pip (never with ``offline``)."""
    found = cached_wheel(cache, name, version)
    if found or offline:
        if not found:
            raise SystemExit(f"no wheel of {name}=={version} for CPython 3.12 manylinux x86-64 in {cache}: "
                             "run make gpu-pack once with a network")
        return found
    Path(cache).mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", f"{PYTHON[0]}.{PYTHON[1]}", "--implementation", "cp", *platforms,
                    "-d", str(cache), f"{name}=={version}"], check=True)
    found = cached_wheel(cache, name, version)
    if not found:
        raise SystemExit(f"pip downloaded no wheel of {name}=={version} that fits CPython 3.12 manylinux x86-64")
    return found


def project_wheel(out_dir):
    """A wheel of this project, built from the files git tracks (as they are in the checkout)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="rngrid-pack-") as tmp:
        copy = Path(tmp) / "src"
        for rel in filter(None, tracked.decode().split("\0")):
            if (ROOT / rel).is_file():
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, copy / rel)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", str(Path(tmp) / "dist"), str(copy)], check=True,
                       stdout=subprocess.DEVNULL)
        (wheel,) = (Path(tmp) / "dist").glob("*.whl")
        return Path(shutil.copy2(wheel, Path(out_dir) / wheel.name))
