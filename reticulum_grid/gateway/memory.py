"""Giving memory freed by large request bodies back to the system.

A request body arrives in pieces of up to 64 KiB (uvicorn's read size) that
become Python bytes objects; those under glibc's mmap threshold (128 KiB, and
it rises to 32 MiB after the first large free) come from the heap, and once
freed glibc keeps them for reuse: a flood of large bodies left the gateway
hundreds of MiB larger after the requests had ended. ``malloc_trim(0)``
(glibc, man 3 malloc_trim) returns the free pages of every arena. It is
called when the last request holding a large body (intake.LARGE_BODY_BYTES)
ends: once after a flood, not once per request, as it walks the whole heap
(about a millisecond per 100 MiB). Elsewhere (musl, macOS) it is a no-op.
"""

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any


def _malloc_trim() -> Callable[[int], Any] | None:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()


def give_back() -> None:
    """Return the C heap's free pages to the system (glibc; elsewhere nothing happens)."""
    if _trim is not None:
        _trim(0)
