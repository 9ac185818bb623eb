"""The uprobe trampoline: its code, and where the kernel puts it (from /proc/PID/maps or a
layout predicted from a load base).

Reference: docs/plan-verify.md ("Trampoline placement"), measured on 6.18.44, and the
6.18 kernel's find_nearest_trampoline() / vm_unmapped_area(): one `r-xp` page named
`[uprobes-trampoline]`, created at the first hit of an optimizable site, at the free page
nearest to site+5 within +/-2 GiB (searching up from site+5 and down from it; the closer
wins, ties go up); an existing trampoline within rel32 reach is reused; when no page is free
there is none and the site stays on the int3 path. A [stack] mapping keeps its guard gap
(256 pages) free below it. Everything here is pure (text and ints in, data out); the live
reader of /proc/PID/maps is usdtpatch.live.procfs.
"""

from __future__ import annotations

import os.path
from dataclasses import dataclass

from usdtpatch.elf.image import ET_DYN, ET_EXEC, PT_LOAD, ElfImage
from usdtpatch.errors import InputError, UnsupportedError
from usdtpatch.kernelfacts import PAGE
from usdtpatch.sequences.sequences import INT32_MAX, INT32_MIN

TRAMPOLINE_NAME = "[uprobes-trampoline]"
TASK_SIZE = 0x7FFFFFFFF000  # x86-64 user space with 4-level paging
STACK_GUARD_GAP = 256 * PAGE  # mm/mmap.c stack_guard_gap default
DEFAULT_PIE_BASE = 0x555555554000  # ELF_ET_DYN_BASE on x86-64 without randomization

@dataclass(frozen=True, slots=True)
class MapEntry:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str  # "" for anonymous mappings


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the trampoline for a site goes: `address` None when there is no free page."""

    address: int | None
    reused: bool  # an existing [uprobes-trampoline] within reach
    reason: str


def parse_maps(text: str, source: str = "maps") -> tuple[MapEntry, ...]:
    """Parse /proc/PID/maps text; a malformed line raises InputError naming it."""
    out: list[MapEntry] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(None, 5)
        try:
            lo, hi = parts[0].split("-")
            entry = MapEntry(start=int(lo, 16), end=int(hi, 16), perms=parts[1],
                             offset=int(parts[2], 16), inode=int(parts[4]),
                             path=parts[5].strip() if len(parts) > 5 else "")
        except (IndexError, ValueError) as exc:
            raise InputError(f"{source}:{lineno}: not a /proc/PID/maps line: {line[:80]!r}"
                             ) from exc
        if entry.end <= entry.start:
            raise InputError(f"{source}:{lineno}: mapping end {entry.end:#x} is not above its "
                             f"start {entry.start:#x}")
        out.append(entry)
    return tuple(out)


def _page_down(v: int) -> int:
    return v & ~(PAGE - 1)


def _page_up(v: int) -> int:
    return (v + PAGE - 1) & ~(PAGE - 1)


def _busy(maps: tuple[MapEntry, ...]) -> list[tuple[int, int]]:
    out = []
    for m in maps:
        start = m.start
        if m.path == "[stack]":
            start = max(0, start - STACK_GUARD_GAP)
        out.append((start, m.end))
    return sorted(out)


def _overlap(busy: list[tuple[int, int]], a: int) -> tuple[int, int] | None:
    for lo, hi in busy:
        if lo < a + PAGE and a < hi:
            return lo, hi
    return None


def existing_trampolines(maps: tuple[MapEntry, ...]) -> list[int]:
    return [m.start for m in maps if m.path == TRAMPOLINE_NAME]


def place_trampoline(maps: tuple[MapEntry, ...], site: int, call_end_offset: int = 5,
                     mmap_min_addr: int = PAGE, gap_pages: int = 2) -> Placement:
    """The page the kernel will use for the trampoline of the site at `site`.

    `call_end_offset` is where the call instruction ends relative to the site (5 for nop5,
    10 for the nop10 generation's). `gap_pages`: the smallest free gap the kernel takes
    a page from (2, below; 1 answers where a page would go had the page after it been free,
    which kcheck asks of mappings read after the kernel placed it: usdtpatch.live.kcheck).
    """
    second = PAGE if gap_pages >= 2 else 0
    call_end = site + call_end_offset
    for t in existing_trampolines(maps):
        if INT32_MIN <= t - call_end <= INT32_MAX:
            return Placement(t, True, f"reuses the existing {TRAMPOLINE_NAME} at {t:#x}")
    busy = _busy(maps)
    high_limit = min(call_end + INT32_MAX, TASK_SIZE)
    low_limit = max(call_end + INT32_MIN, PAGE, _page_up(mmap_min_addr))
    high: int | None = _page_up(call_end)
    # the kernel asks vm_unmapped_area for a page with a page's alignment mask added to the
    # length (the worst-case alignment overhead): only a gap of two pages or more is taken,
    # at its lowest page going up and its highest page going down (seen with a one-page gap
    # left by ld.so's alignment of a library with p_align 0x4000: the kernel went below)
    while high is not None and high + PAGE <= high_limit:
        hit = _overlap(busy, high) or (_overlap(busy, high + second) if second else None)
        if hit is None:
            break
        high = _page_up(hit[1])
    if high is not None and high + PAGE > high_limit:
        high = None
    low: int | None = _page_down(call_end - PAGE) if call_end >= PAGE else None
    while low is not None and low >= low_limit:
        hit = _overlap(busy, low) or ((_overlap(busy, low - second) if low >= PAGE
                                        else (0, PAGE)) if second else None)
        if hit is None:
            break
        low = _page_down(hit[0] - PAGE) if hit[0] >= PAGE else None
    if low is not None and low < low_limit:
        low = None
    if high is None and low is None:
        return Placement(None, False, f"no free page within +/-2 GiB of {call_end:#x}")
    if high is None or (low is not None and call_end - low < high - call_end):
        assert low is not None
        return Placement(low, False, f"nearest free page below {call_end:#x}")
    return Placement(high, False, f"nearest free page above {call_end:#x}")


def layout_from_load_base(image: ElfImage, load_base: int, path: str = "") -> tuple[MapEntry, ...]:
    """The mappings the loader makes for the file's PT_LOAD segments at `load_base`."""
    out = []
    for seg in image.segments:
        if seg.type != PT_LOAD or seg.memsz == 0:
            continue
        lo = load_base + _page_down(seg.vaddr)
        hi = load_base + _page_up(seg.vaddr + seg.memsz)
        perms = ("r" if seg.flags & 4 else "-") + ("w" if seg.flags & 2 else "-") + (
            "x" if seg.flags & 1 else "-") + "p"
        out.append(MapEntry(start=lo, end=hi, perms=perms, offset=_page_down(seg.offset), inode=0,
                            path=path))
    return tuple(sorted(out, key=lambda m: m.start))


def default_load_base(image: ElfImage) -> int:
    """Where the file is assumed to be loaded when nothing says otherwise."""
    return DEFAULT_PIE_BASE if image.type == ET_DYN else 0


def check_load_base(image: ElfImage, load_base: int) -> None:
    """Refuse a load base the loader could not use (unaligned, or moving an ET_EXEC)."""
    if load_base % PAGE:
        raise InputError(f"load base {load_base:#x} is not page aligned")
    if image.type == ET_EXEC and load_base != 0:
        raise UnsupportedError(f"load base {load_base:#x} given for a non-PIE executable "
                               f"(ET_EXEC is loaded at its link addresses; use 0)")
    if load_base < 0 or load_base >= TASK_SIZE:
        raise InputError(f"load base {load_base:#x} is outside user space")


def load_base_from_maps(image: ElfImage, maps: tuple[MapEntry, ...], path: str) -> int | None:
    """The load base of the file `path` in a maps snapshot (matched by path, then basename)."""
    loads = sorted((s for s in image.segments if s.type == PT_LOAD), key=lambda s: s.vaddr)
    if not loads:
        return None
    first = loads[0]
    want = {path, os.path.realpath(path)} if path else set()
    base_name = os.path.basename(path)
    candidates = [m for m in maps if m.path in want] or [
        m for m in maps if m.path and os.path.basename(m.path) == base_name]
    for m in sorted(candidates, key=lambda m: m.start):
        if m.offset == _page_down(first.offset):
            base = m.start - _page_down(first.vaddr)
            return 0 if image.type == ET_EXEC else base
    return None
