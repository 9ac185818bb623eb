"""Trampoline placement from maps and from a load base, as measured on 6.18 (docs/kernel.md):
the free page nearest to site+5 within +/-2 GiB, the closer of the searches up and down,
an existing trampoline within reach reused, none when nothing is free."""

from __future__ import annotations

import pytest

from tests.helpers import fixture
from usdtpatch.api import load
from usdtpatch.errors import InputError, UnsupportedError
from usdtpatch.sequences.trampoline import (
    MapEntry,
    check_load_base,
    layout_from_load_base,
    load_base_from_maps,
    parse_maps,
    place_trampoline,
)

PIE_MAPS = """\
555555554000-555555555000 r--p 00000000 fe:01 1234 /tmp/x/prog
555555555000-555555556000 r-xp 00001000 fe:01 1234 /tmp/x/prog
555555556000-555555557000 r--p 00002000 fe:01 1234 /tmp/x/prog
555555557000-555555559000 rw-p 00002000 fe:01 1234 /tmp/x/prog
555555559000-55555557a000 rw-p 00000000 00:00 0 [heap]
7ffff7dd0000-7ffff7ff0000 r-xp 00000000 fe:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]
"""


def m(lo: int, hi: int, path: str = "") -> MapEntry:
    return MapEntry(lo, hi, "r-xp", 0, 0, path)


def test_parse_maps() -> None:
    maps = parse_maps(PIE_MAPS)
    assert len(maps) == 7
    assert maps[1].start == 0x555555555000 and maps[1].perms == "r-xp"
    assert maps[1].offset == 0x1000 and maps[1].path == "/tmp/x/prog"
    assert maps[4].path == "[heap]"


@pytest.mark.parametrize("line", [
    "zzzz-1000 r-xp 00000000 00:00 0", "2000-1000 r-xp 00000000 00:00 0", "1000-2000",
], ids=["not-hex", "end-below-start", "short"])
def test_parse_maps_rejects(line: str) -> None:
    with pytest.raises(InputError, match="maps:1"):
        parse_maps(line + "\n")


def test_pie_page_below_the_executable() -> None:
    p = place_trampoline(parse_maps(PIE_MAPS), 0x555555555100)
    assert p.address == 0x555555553000 and not p.reused


def test_page_below_taken_goes_further_down() -> None:
    maps = (*parse_maps(PIE_MAPS), m(0x555555550000, 0x555555554000))
    assert place_trampoline(maps, 0x555555555100).address == 0x55555554F000


def test_nonpie_below_0x400000() -> None:
    maps = (m(0x400000, 0x401000), m(0x401000, 0x402000), m(0x402000, 0x404000))
    assert place_trampoline(maps, 0x401040).address == 0x3FF000


def test_space_below_full_goes_up() -> None:
    maps = (m(0x1000, 0x402000), m(0x402000, 0x404000))
    assert place_trampoline(maps, 0x401040).address == 0x404000


def test_closer_wins_upward() -> None:
    # the site sits near the end of a large mapping: the gap above is closer than below
    maps = (m(0x10000000, 0x10100000), m(0x0FF00000, 0x10000000))
    p = place_trampoline(maps, 0x100FF000)
    assert p.address == 0x10100000


def test_existing_trampoline_is_reused() -> None:
    maps = (*parse_maps(PIE_MAPS), m(0x555555540000, 0x555555541000, "[uprobes-trampoline]"))
    p = place_trampoline(maps, 0x555555555100)
    assert p.address == 0x555555540000 and p.reused


def test_existing_trampoline_out_of_reach_is_not_reused() -> None:
    maps = (*parse_maps(PIE_MAPS), m(0x1000000, 0x1001000, "[uprobes-trampoline]"))
    p = place_trampoline(maps, 0x555555555100)
    assert p.address == 0x555555553000 and not p.reused


def test_nothing_free_within_reach() -> None:
    site = 0x200000000
    maps = (m(site - (1 << 31) - 0x10000, site + (1 << 31) + 0x10000),)
    assert place_trampoline(maps, site).address is None


def test_stack_guard_gap_is_kept() -> None:
    stack = MapEntry(0x7FFFFFFDE000, 0x7FFFFFFFF000, "rw-p", 0, 0, "[stack]")
    below = MapEntry(0x7FFFFF000000, 0x7FFFFFF00000, "r-xp", 0, 0, "")
    # the free page right above `below` lies in the stack's 1 MiB guard gap: go down instead
    assert place_trampoline((below, stack), 0x7FFFFFEFF000).address == 0x7FFFFEFFF000
    assert place_trampoline((below,), 0x7FFFFFEFF000).address == 0x7FFFFFF00000


def test_layout_and_load_base_from_maps() -> None:
    ps = load(str(fixture("nop5")))
    layout = layout_from_load_base(ps.image, 0x555555554000, "/tmp/nop5")
    assert layout[0].start == 0x555555554000
    assert load_base_from_maps(ps.image, layout, "/elsewhere/nop5") == 0x555555554000
    assert load_base_from_maps(ps.image, layout, "/tmp/other") is None


@pytest.mark.parametrize(("name", "base", "exc"), [
    ("nop5", 0x555555554001, InputError),
    ("nopie", 0x10000, UnsupportedError),
], ids=["unaligned", "moving-et-exec"])
def test_check_load_base_rejects(name: str, base: int, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        check_load_base(load(str(fixture(name))).image, base)


def test_a_one_page_gap_is_not_taken() -> None:
    """The kernel's search adds the page alignment mask to the length: a one-page gap is too
    small (seen on Linux 6.18.44: a library loaded with p_align 0x4000 left one free page
    just above it, and the kernel put the trampoline below the library)."""
    lib = m(0x7F0000000000, 0x7F0000006000, "/tmp/lib.so")
    above = m(0x7F0000007000, 0x7F000000C000)  # one free page between
    below = m(0x7EFFFFFF0000, 0x7EFFFFFFF000)  # one free page below the library, then taken
    p = place_trampoline((lib, above, below), 0x7F0000005230)
    assert p.address == 0x7F000000C000  # past the one-page gap, above the next mapping
    wide = m(0x7F0000008000, 0x7F000000C000)  # now two free pages above the library
    assert place_trampoline((lib, wide, below), 0x7F0000005230).address == 0x7F0000006000
