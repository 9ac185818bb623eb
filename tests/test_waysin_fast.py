"""The file-wide index's rel32 scan (usdtpatch.analysis.waysin: opcodes found chunk by chunk with a
pattern that also checks the displacement's upper half) against a plain walk over every byte,
on fixtures and on random buffers: it must find exactly the call/jmp/jcc/lea whose target is
protected, and none whose target lies one byte outside."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import ROOT
from usdtpatch.analysis import waysin
from usdtpatch.analysis.waysin import CHUNK, _code_hits, _regions, _spans, code_ranges
from usdtpatch.api import load

Hit = tuple[int, str, int]


def reference(data: bytes, vaddr: int, protected: set[int]) -> list[Hit]:
    """(source, name, target) of every rel32 opcode whose target is protected, one byte at a
    time: call/jmp in address order, then jcc, then lea (the index's order)."""
    out: dict[str, list[Hit]] = {"branch": [], "jcc": [], "lea": []}
    for q in range(len(data)):
        b0, b1 = data[q], (data[q + 1] if q + 1 < len(data) else -1)
        if b0 in (0xE8, 0xE9):
            head, group, name = 1, "branch", "call" if b0 == 0xE8 else "jmp"
        elif b0 == 0x0F and 0x80 <= b1 <= 0x8F:
            head, group, name = 2, "jcc", "jcc"
        elif b0 == 0x8D and b1 & 0xC7 == 0x05:
            head, group, name = 2, "lea", "lea"
        else:
            continue
        if q + head + 4 > len(data):
            continue
        (disp,) = struct.unpack_from("<i", data, q + head)
        target = vaddr + q + head + 4 + disp
        if target in protected:
            out[group].append((vaddr + q, name, target))
    return [*out["branch"], *out["jcc"], *out["lea"]]


def fast(data: bytes, vaddr: int, sites: list[tuple[int, int, int]],
         starts: list[int]) -> tuple[list[Hit], set[int]]:
    protected = _regions(sites, starts)
    return _code_hits(data, vaddr, protected, _spans(sites, CHUNK)), set(protected)


def _plant(buf: bytearray, vaddr: int, at: int, kind: int, target: int) -> None:
    """Write a call/jmp/jcc/lea at offset `at` of `buf` aimed at `target` (if it fits)."""
    opcode = (b"\xe8", b"\xe9", b"\x0f\x84", b"\x48\x8d\x05")[kind]
    head = len(opcode) if kind != 3 else 2  # lea: the displacement follows 8d and ModRM
    start = at - (1 if kind == 3 else 0)
    disp = target - (vaddr + at + head + 4)
    if start < 0 or start + len(opcode) + 4 > len(buf) or not -(1 << 31) <= disp < 1 << 31:
        return
    buf[start:start + len(opcode) + 4] = opcode + struct.pack("<i", disp)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(0, 2 * CHUNK + 64),
       vaddr=st.sampled_from([0, 0x1000, 0x401000, 0x7FFF_F000, 0x1_0000_0000]),
       nsites=st.integers(1, 6), planted=st.integers(0, 300))
def test_random_buffers_match_the_reference(seed: int, size: int, vaddr: int, nsites: int,
                                            planted: int) -> None:
    rng = random.Random(seed)
    # random bytes rich in the opcodes (and in the upper halves 00 00 / ff ff)
    alphabet = bytes([0xE8, 0xE9, 0x0F, 0x84, 0x8D, 0x05, 0x3D, 0x00, 0xFF, 0x90, 0x7F])
    buf = bytearray(rng.choice(alphabet) if rng.random() < 0.5 else rng.randrange(256)
                    for _ in range(size))
    # probes in the buffer, and some far away (other sections, 2 GiB off)
    sites = []
    for _ in range(nsites):
        pc = vaddr + rng.randrange(max(size, 1)) if rng.random() < 0.7 else \
            vaddr + rng.randrange(-(1 << 31), 1 << 31)
        pc = max(pc, 0)
        if rng.random() < 0.5:
            sites.append((pc, max(0, pc - rng.randrange(300)), pc + rng.randrange(1, 300)))
        else:
            sites.append((pc, pc, pc))
    starts = sorted({s[1] for s in sites})
    protected = set(_regions(sites, starts))
    spans = _spans(sites, CHUNK)
    edges = [a for lo, hi in spans for a in (lo - 1, lo, hi - 1, hi)]
    for _ in range(planted):
        target = rng.choice(edges) if rng.random() < 0.5 else rng.choice(sorted(protected)) \
            if protected else rng.choice(edges)
        at = rng.choice([CHUNK - 1, CHUNK - 3, CHUNK, 2 * CHUNK - 2]) if rng.random() < 0.2 \
            else rng.randrange(max(size, 1))
        _plant(buf, vaddr, at, rng.randrange(4), target)
    data = bytes(buf)
    got, prot = fast(data, vaddr, sites, starts)
    assert prot == protected
    assert got == reference(data, vaddr, protected)


def test_edges_found_and_one_byte_outside_rejected() -> None:
    """Branches from across a chunk boundary at the first and last protected bytes are found;
    at the bytes just outside (and at a function start inside) they are not."""
    vaddr, size = 0x400000, 3 * CHUNK
    pc = vaddr + 2 * CHUNK + 500
    sites = [(pc, pc - 40, pc + 30)]  # protected: _span's [lo, hi), less the starts
    starts = [pc - 40, pc + 10]
    lo, hi = _span(*sites[0])
    buf = bytearray(b"\x90" * size)
    wanted = {lo, lo + 1, pc, hi - 1}
    rejected = {lo - 1, pc - 40, pc + 10, hi}  # outside, or a function start
    at = [CHUNK - 2, CHUNK - 10, 100, 2 * CHUNK + 2000, 3 * CHUNK - 9, 3 * CHUNK - 20,
          CHUNK + 7, 5000]
    for i, target in enumerate(sorted(wanted | rejected)):
        _plant(buf, vaddr, at[i], i % 4, target)
    data = bytes(buf)
    got, protected = fast(data, vaddr, sites, starts)
    assert {t for _s, _n, t in got} == wanted
    assert got == reference(data, vaddr, protected)
    assert len(got) == 4


@pytest.mark.parametrize("kind", range(4))
@pytest.mark.parametrize("far", [-3, -1, 0, 2])
def test_chunk_edges_at_half_boundaries(kind: int, far: int) -> None:
    """The opcode at the first and at the last offset of a chunk, aimed at the first and the
    last protected byte with a displacement whose lower half is ffff or 0000: the upper half
    just changes there, so a bound of the prefilter one byte too tight loses the branch."""
    vaddr, size = 0x2000000, 2 * CHUNK + 16
    head = 1 if kind < 2 else 2
    for q, edge, low in ((2 * CHUNK - 1, "lo", 0xFFFF), (CHUNK, "hi", 0),
                         (CHUNK, "lo", 0xFFFF), (2 * CHUNK - 1, "hi", 0)):
        disp = (far << 16) + low
        target = vaddr + q + head + 4 + disp
        pc = target + 128 if edge == "lo" else target - 71  # [pc - 128, pc + 72)
        buf = bytearray(b"\x90" * size)
        _plant(buf, vaddr, q, kind, target)
        data = bytes(buf)
        got, protected = fast(data, vaddr, [(pc, pc, pc)], [])
        assert target in protected  # (the buffer holds nothing else the reference would find)
        assert got == [(vaddr + q, ("call", "jmp", "jcc", "lea")[kind], target)], (q, edge)


def test_the_prefilter_rejects_far_candidates() -> None:
    """The chunked patterns do filter: of many calls aimed 1 MiB away from a lone probe, none
    is even a candidate; the same calls aimed at the probe all are."""
    vaddr, pc = 0x10000, 0x10000 + 5 * CHUNK
    sites = [(pc, pc, pc)]
    spans = _spans(sites, CHUNK)
    for target, want in ((pc + (1 << 20), 0), (pc + 8, 1)):
        buf = bytearray(b"\x90" * (4 * CHUNK))
        for q in range(0, len(buf) - 5, 64):
            _plant(buf, vaddr, q, 0, target)
        cands = waysin._candidates(bytes(buf), vaddr, rb"\xe8", 1, spans)
        assert len(cands) == want * len(range(0, len(buf) - 5, 64))


@pytest.mark.parametrize("name", ["demo", "call-window", "cxx-callwin", "libprobes.so",
                                  "branch-after", "fork"])
@pytest.mark.parametrize("where", ["probes", "everywhere"])
def test_fixtures_match_the_reference(name: str, where: str) -> None:
    """Regions around the fixture's probes, or covering all of its code and the bytes after
    it (every call, jmp, jcc and lea aimed at the code hits)."""
    path = ROOT / "fixtures" / "bin" / name
    ps = load(str(path))
    image = ps.image
    ranges = code_ranges(image)
    if where == "probes":
        sites = [(p.address, p.address - 100, p.address + 100) for p in ps.probes]
    else:
        sites = [(a, a, a) for v, _o, n in ranges for a in range(v, v + n + 200, 150)]
    assert sites
    starts = sorted(ps.symbols.addresses if ps.symbols else ()) if where == "probes" else []
    total = 0
    for vaddr, off, size in ranges:
        data = bytes(image.data[off:off + size])
        got, protected = fast(data, vaddr, sites, starts)
        assert got == reference(data, vaddr, protected)
        total += len(got)
    if where == "everywhere":
        assert total > 0


LIBJVM = "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so"


def test_libjvm_slice_matches_the_reference() -> None:
    """Six chunks (1.5 MiB) of libjvm's .text (real compiler output), regions around its probes
    and every 4 KiB across the slice."""
    try:
        ps = load(LIBJVM)
    except (OSError, SystemExit):
        pytest.skip("no libjvm.so")
    image = ps.image
    vaddr, off, _size = max(code_ranges(image), key=lambda r: r[2])
    lo = min(p.address for p in ps.probes) - 300_000
    lo = max(lo, vaddr)
    data = bytes(image.data[off + lo - vaddr:off + lo - vaddr + 6 * CHUNK])
    sites = [(p.address, p.address - 120, p.address + 80) for p in ps.probes]
    sites += [(a, a, a) for a in range(lo, lo + len(data), 4096)]
    got, protected = fast(data, lo, sites, sorted(ps.symbols.addresses if ps.symbols else ()))
    assert got == reference(data, lo, protected)
    assert len(got) > 100


@pytest.mark.parametrize("name", ["demo", "call-window", "branch-after", "libprobes.so"])
def test_rel8_sources_match_the_reference(name: str) -> None:
    """The short branches near each probe (outside its function) aimed at a protected byte,
    against a walk over every byte of those spans; with probes every 150 bytes, so that
    every short branch of the code is near one."""
    ps = load(str(ROOT / "fixtures" / "bin" / name))
    image = ps.image
    ranges = code_ranges(image)
    sites = [(a, a - 20, a + 20) for v, _o, n in ranges for a in range(v, v + n, 150)]
    protected = _regions(sites, [])
    got = [(w.source, w.target) for w in waysin._scan_code(image, protected, sites)
           if w.kind == waysin.BRANCH_REL8]
    spans: set[tuple[int, int]] = set()
    for pc, fstart, fend in sites:
        lo, hi = pc - waysin.BEFORE - 130, pc + waysin.AFTER + 128
        spans.update(((lo, fstart), (fend, hi)))
    want = []
    for lo, hi in sorted(spans):
        for vaddr, off, size in ranges:
            for src in range(max(lo, vaddr), min(hi, vaddr + size) - 1):
                op, d = image.data[off + src - vaddr], image.data[off + src - vaddr + 1]
                if op == 0xEB or 0x70 <= op <= 0x7F or 0xE0 <= op <= 0xE3:
                    t = src + 2 + (d - 256 if d > 127 else d)
                    if t in protected:
                        want.append((src, t))
    assert got == want
    assert want


def test_wide_chunks_fall_back_to_the_plain_opcode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk that could reach too many upper halves is searched for the opcode alone: the
    same hits (here every chunk is made to fall back)."""
    ps = load(str(ROOT / "fixtures" / "bin" / "libprobes.so"))
    image = ps.image
    ranges = code_ranges(image)
    sites = [(a, a, a) for v, _o, n in ranges for a in range(v, v + n + 200, 150)]
    monkeypatch.setattr(waysin, "_WIDE", 0)
    for vaddr, off, size in ranges:
        data = bytes(image.data[off:off + size])
        got, protected = fast(data, vaddr, sites, [])
        assert got == reference(data, vaddr, protected)


def _span(pc: int, fstart: int, fend: int) -> tuple[int, int]:
    """The bytes a window of the probe at `pc` may cover (waysin's rule, docs/rewrite.md)."""
    lo, hi = pc - waysin.BEFORE, pc + waysin.AFTER
    if fstart < fend:  # the padding on both sides of the function too (a stub may go there)
        lo, hi = max(lo, fstart - 64), min(hi, fend + 64)
    return max(0, lo), hi


def _regions_as_a_set(sites: list[tuple[int, int, int]], starts: list[int]) -> set[int]:
    """The protected addresses as the branch start's _regions made them: every address of
    each probe's span, less the function starts in it."""
    out: set[int] = set()
    for site in set(sites):
        lo, hi = _span(*site)
        out.update(range(lo, hi))
        out.difference_update(a for a in starts if lo <= a < hi)
    return out


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), nsites=st.integers(0, 12))
def test_regions_answer_as_the_set_of_addresses(seed: int, nsites: int) -> None:
    """`in`, `intersection` and iteration of the protected regions say what the set of every
    protected address says, at and around every span's edges and function start."""
    rng = random.Random(seed)
    sites = []
    for _ in range(nsites):
        pc = rng.choice([0, 5, 0x1000, 0x400000, 1 << 32]) + rng.randrange(600)
        sites.append((pc, max(0, pc - rng.randrange(300)), pc + rng.randrange(1, 300))
                     if rng.random() < 0.6 else (pc, pc, pc))
    starts = sorted({s[1] for s in sites} | {rng.randrange(0x400800) for _ in range(5)})
    want = _regions_as_a_set(sites, starts)
    got = _regions(sites, starts)
    assert sorted(got) == sorted(want)
    probe = sorted({a + d for s in sites for a in (*_span(*s), *s)
                    for d in (-2, -1, 0, 1, 2)} | set(starts) | {-1, 1 << 64})
    assert [a in got for a in probe] == [a in want for a in probe]
    assert got.intersection(probe) == want.intersection(probe)
    assert got.intersection(iter(probe)) == want.intersection(probe)


def test_regions_hold_no_object_per_address() -> None:
    """10,000 probes in 16-byte functions (the synthetic library's layout): the protected
    regions take a few hundred KB, not an int object and a set slot per address (13 MB)."""
    import tracemalloc

    sites = [(0x10004 + 16 * k, 0x10000 + 16 * k, 0x10010 + 16 * k) for k in range(10_000)]
    starts = [s[1] for s in sites]
    tracemalloc.start()
    try:
        got = _regions(sites, starts)
        size, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    last = 0x10004 + 16 * 9_999 + waysin.AFTER - 1
    assert 0x10004 in got and 0x10000 not in got and last in got and last + 1 not in got
    assert size < 2_000_000


_ADDR = st.integers(min_value=0, max_value=(1 << 33))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_ADDR, st.integers(min_value=-8, max_value=1 << 20)), max_size=40),
       _ADDR, st.integers(min_value=0, max_value=1 << 21))
def test_reach_gives_the_halves_span_by_span(pairs: list[tuple[int, int]], emin: int,
                                             extent: int) -> None:
    """Reach.halves, half by half where there are more spans than halves to test, says what
    the span-by-span walk says, for any sorted spans (empty and far ones too: displacements
    past 2 GiB are clipped alike)."""
    spans = sorted((lo, lo + size) for lo, size in pairs)
    emax = emin + extent
    assert waysin.Reach(spans).halves(emin, emax) == waysin.high_halves(spans, emin, emax)
    # the same spans packed into 256 KiB near a source: fewer halves to test than spans
    packed = sorted((emin + (lo & 0x3FFFF) - (1 << 17), emin + (lo & 0x3FFFF) - (1 << 17)
                     + (size & 0xFFF)) for lo, size in pairs)
    assert waysin.Reach(packed).halves(emin, emax) == waysin.high_halves(packed, emin, emax)


def test_reach_tests_halves_not_spans_where_spans_are_many(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A chunk asked of 50,000 spans in 3 MiB tests its ~50 halves, not every span (asked of
    every span per chunk, the index of a million-probe file was quadratic); the answer is the
    span-by-span one."""
    spans = [(0x400000 + 64 * k, 0x400000 + 64 * k + 8) for k in range(50_000)]
    want = waysin.high_halves(spans, 0x500000, 0x540000)
    walked: list[int] = []
    real = waysin.high_halves

    def counted(s: list[tuple[int, int]], a: int, b: int) -> set[int]:
        walked.append(len(s))
        return real(s, a, b)

    monkeypatch.setattr(waysin, "high_halves", counted)
    assert waysin.Reach(spans).halves(0x500000, 0x540000) == want and want
    assert walked == []
