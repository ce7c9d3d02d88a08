"""What a GGUF says it is (architecture, quantisation, model or adapter),
read from the start of its metadata alone.

The gguf library's reader parses every field and tensor entry into numpy
views before answering: 1-3 s for one file with a 49k-token vocabulary, and
a listing of every model on a machine asks dozens. The three fields a
listing needs come first in every GGUF llama.cpp's tools write, so this
reads key/value pairs (ggml's docs/gguf.md: little-endian, version 2 or 3,
64-bit counts and lengths) until it has them, skipping arrays by their
length. Value types are the gguf library's ``GGUFValueType``.
"""

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

import gguf
from gguf import GGUFValueType as T

#: struct formats of GGUF's scalar value types.
_SCALARS = {T.UINT8: "<B", T.INT8: "<b", T.UINT16: "<H", T.INT16: "<h", T.UINT32: "<I", T.INT32: "<i",
            T.FLOAT32: "<f", T.BOOL: "<?", T.UINT64: "<Q", T.INT64: "<q", T.FLOAT64: "<d"}
_WANTED = ("general.architecture", "general.file_type", "general.type")
#: Longest string read (bytes): a damaged length must not become one huge allocation.
MAX_STRING = 1 << 26


@dataclass(frozen=True)
class Header:
    """``arch``: general.architecture; ``quantization``: llama.cpp's file type
    ("Q4_K_M", None when the file or the gguf library does not say);
    ``adapter``: general.type is "adapter" (a LoRA for another model)."""
    arch: str
    quantization: str | None
    adapter: bool


def read(path: str | os.PathLike[str]) -> Header:
    """The Header of the GGUF at ``path``. Raises ValueError for a file that
    is not a readable GGUF (or names no architecture)."""
    with open(path, "rb") as f:
        magic, version = struct.unpack("<4sI", _exactly(f, 8))
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"not a GGUF file of version 2 or 3 (magic {magic!r}, version {version})")
        kv_count = struct.unpack("<QQ", _exactly(f, 16))[1]
        fields: dict[str, object] = {}
        for _ in range(kv_count):
            key = _string(f)
            value = _value(f, struct.unpack("<I", _exactly(f, 4))[0])
            if key in _WANTED:
                fields[key] = value
            if len(fields) == len(_WANTED):
                break
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("its metadata names no general.architecture")
    return Header(arch, quantization_name(fields.get("general.file_type")), fields.get("general.type") == "adapter")


def quantization_name(file_type: object) -> str | None:
    """llama.cpp's name of a general.file_type number ("Q4_1"), None when unknown."""
    try:
        return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")  # type: ignore[call-overload]
    except (TypeError, ValueError):  # absent, or a file type this gguf library does not know yet
        return None


def _exactly(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError("the GGUF metadata ends early")
    return data


def _string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", _exactly(f, 8))
    if length > MAX_STRING:
        raise ValueError(f"a GGUF string of {length} bytes")
    return _exactly(f, length).decode("utf-8", "replace")


def _value(f: BinaryIO, kind: int) -> object:
    """One value of type ``kind``; an array is skipped (None)."""
    if kind in _SCALARS:
        fmt = _SCALARS[T(kind)]
        return struct.unpack(fmt, _exactly(f, struct.calcsize(fmt)))[0]
    if kind == T.STRING:
        return _string(f)
    if kind != T.ARRAY:
        raise ValueError(f"unknown GGUF value type {kind}")
    item, count = struct.unpack("<IQ", _exactly(f, 12))
    if item in _SCALARS:
        f.seek(count * struct.calcsize(_SCALARS[T(item)]), os.SEEK_CUR)
    else:
        for _ in range(count):
            _value(f, item)
    return None
