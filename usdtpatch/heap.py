"""Giving the memory a phase freed back to the system (issue 38: rewrite's peak memory).

CPython keeps what it frees: small objects in its own arenas, larger ones (lists, dicts,
bytes over 512 bytes) in the C library's heap, whose freed pages stay resident until the
heap's top is freed. A rewrite frees most of its analysis (the check's windows, the plan's
working state) before it allocates its output, a buffer the size of the file, mapped fresh:
without the freed pages returned first, the output sat on top of them (at 100,000 probes,
~30 MiB of the peak). glibc's malloc_trim returns them (madvise: the pages are dropped, the
heap stays); a C library without it (musl) leaves them, and nothing else changes.

Deferred imports: ctypes, at the first call (api.py imports this module, so every command
does: only a rewrite loads ctypes).
"""

from __future__ import annotations

from collections.abc import Callable

_TRIM: list[Callable[[int], object] | None] = []  # malloc_trim, looked up once


def give_back() -> None:
    """Return the C library heap's free pages to the system, where the library can."""
    trim = malloc_trim()
    if trim is not None:
        trim(0)


def malloc_trim() -> Callable[[int], object] | None:
    """The C library's malloc_trim, or None where it has none (musl)."""
    if not _TRIM:
        import ctypes

        _TRIM.append(getattr(ctypes.CDLL(None), "malloc_trim", None))
    return _TRIM[0]
