"""Every way into the code around the probes from the whole file: one index, built once per file.

A patch window must have no way in strictly inside it that the rewrite does not aim at the
detour (docs/rewrite.md, "What is proven before a window is used"). A function's own branches,
jump tables, landing pads and related `.cold` parts are its analysis's (usdtpatch.analysis.targets);
this index adds what lies outside it, found by scanning the whole file once:

- direct branches from any executable section: every `e8`/`e9` (call/jmp rel32), `0f 80-8f`
  (jcc rel32) and `c7 f8` (xbegin rel32: its fallback address) byte sequence whose
  displacement lands in a region, every `eb`/`70-7f`/`e0-e3` (rel8) within reach of one, and
  every `66 c7 f8` (xbegin rel16). These are every opcode whose operand iced-x86 decodes as a
  near branch target in 64-bit code (tests/test_analysis_relative.py derives them from its
  operand kinds); an xbegin's way in is never aimed at the detour (XBEGIN).
  The scan reads bytes, not instructions: a hit is kept unless the
  linear disassembly of the function holding it (done lazily, by the function analysis) shows
  that no instruction starts there (the bytes belong to another instruction);
- rip-relative `lea` (`8d` with a rip-relative ModRM) anywhere in code: the address of a label
  taken (a computed goto's `&&label` at -O0, a `lea` kept in a register or on the stack);
- relocations: every entry of an allocated SHT_RELA table (the loader's) whose value
  (R_X86_64_RELATIVE / IRELATIVE: the addend; R_X86_64_64 and the other symbol relocations:
  the symbol's value + addend) lands in a region;
- 4-byte relative jump tables of any function: an int32 word E at any address A of an
  allocated non-executable PROGBITS section (not `.eh_frame`) such that T + E lands in a region
  for a table base T in [A - 16 KiB, A] with A - T a multiple of 4, where T is the target of a
  rip-relative `lea` anywhere in code (what a PIC switch's table is addressed by). The words
  are found with the rel32 scan's prefilter (their upper half must be one that can reach a
  region), then the `lea`s of the candidate bases by the rel32 scan itself;
- 4-byte relative tables placed in code (hand-written assembly, `.text` tables): at each
  rip-relative `lea` target T that lies in code and is no function start, the int32 words
  at T, T + 4, ... up to the next `lea` target (at most TABLE_BYTES) whose T + E lands in a
  region. A hit whose bytes decoding the function holding them reaches as instructions is
  dropped by the function analysis (CodeContext.decoded_as_code);
- landing pads: the call-site table of the LSDA of every FDE (only the FDEs whose CIE has an
  LSDA encoding are parsed: the CIE pointer of each FDE is read without parsing it);
- data words: in a fixed-address file, every 32-bit value (and 64-bit value, for regions above
  4 GiB) at any byte of any allocated section, code included, that is an address in a region:
  a non-PIE `&&label` table, an `.init_array`-like table, a table of handlers, an unaligned
  word, a `mov $imm32` or `push imm32` of the address (a position-independent file holds no
  usable absolute address in its bytes: the loader stores each one through a relocation).

The regions are the bytes around each probe a window can cover ([pc - 128, pc + 72), within
its function and the padding after it), less the function starts (a start is a target
anyway). The scans are C-level passes (regex search, map, set intersection), linear in the
file's code. The rel32 scan reads only the candidates whose target can land near a region: for
each 256 KiB of sources, the displacements that reach a region from there have one of a few
upper halves (their two high bytes), and one compiled pattern per chunk and opcode matches
the opcode followed by such a displacement; each match's target is then computed exactly
(libjvm.so's 14 MB: ~600,000 opcodes, ~160,000 candidates, ~0.17 s for the index;
docs/performance.md). tests/test_waysin_fast.py holds it to a byte-by-byte walk.
"""

from __future__ import annotations

import re
import struct
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import compress, repeat
from mmap import mmap
from operator import add, itemgetter, rshift
from typing import Protocol

from usdtpatch.elf.cfi import CfiError, CfiIndex, Cie, parse_cie, parse_lsda
from usdtpatch.elf.ehframe import foreign_personality
from usdtpatch.elf.image import (
    ET_EXEC,
    PF_X,
    PT_LOAD,
    SHF_EXECINSTR,
    SHT_NOBITS,
    SHT_PROGBITS,
    ElfImage,
)
from usdtpatch.elf.model import (
    CODE_ADDRESS_TAGS,
    DYNAMIC_TAGS,
    RELOCATION_TYPES,
    RELR,
    dynamic_entries,
    dynamic_segment,
    loader_relocations,
)

BEFORE = 128  # bytes before a probe a window may start (8 instructions, rounded up)
AFTER = 72  # bytes after a probe a window may end (64 + the probe)

# kinds of way in (Target.kind in the function analysis)
BRANCH_REL32 = "branch-from-elsewhere"  # a direct jmp/jcc/call rel32 outside the function
BRANCH_REL8 = "short-branch-from-elsewhere"  # a direct jmp/jcc rel8 outside the function
XBEGIN = "xbegin-from-elsewhere"  # an xbegin (rel32 or rel16) outside the function
ADDRESS_TAKEN = "address-taken"  # a rip-relative lea of the address (code anywhere)
RELOCATION = "relocation"  # a relocation whose value is the address
DATA_WORD = "data-word"  # an absolute word in the file's data holding the address
CODE_WORD = "code-word"  # an absolute value in the file's code (a mov/push immediate)
REL_TABLE = "relative-table-entry"  # an entry of a 4-byte relative table (table + int32)
PLACE_RELATIVE = "place-relative-word"  # a word holding the address less its own (.long x - .)
LANDING_PAD = "landing-pad"  # a landing pad an LSDA names
TABLE_BYTES = 4 * 4096  # how far a relative table's entry may lie from its base
PLACE_ADDEND = 8  # a place-relative word W at A names A + W + k for |k| <= this

CODE_KINDS = frozenset({BRANCH_REL32, BRANCH_REL8, XBEGIN, ADDRESS_TAKEN})
_S32 = struct.Struct("<i")


@dataclass(frozen=True, slots=True)
class WayIn:
    """One way into `target`: `source` is the branch or `lea` instruction's address (code
    kinds), or the address of the word or relocated place (data kinds); `what` describes it."""

    target: int
    kind: str
    source: int
    what: str
    base: int = 0  # REL_TABLE: the table's address (the `lea`'s target); PLACE_RELATIVE: k


class WaysIn:
    """The index: target -> every way in found by the file-wide scans."""

    def __init__(self, ways: Iterable[WayIn], poisoned: dict[int, str] | None = None,
                 everywhere: str | None = None,
                 named: dict[int, tuple[int, str]] | None = None) -> None:
        # code address -> (A, what) of the place-relative word W at A that names it exactly
        # (A + W), function starts included: an instruction whose pc the file's data records
        # (a static key's site, which is patched at run time; a fault's pc, looked up in a
        # fixup table) does not move (analysis/check.py's _stays: window-place-named)
        self.named = named or {}
        # function start -> why every instruction boundary of it is a possible way in (a
        # computed jump whose base lies in it, arithmetic on an address in it:
        # usdtpatch.analysis.computed); `everywhere`: why that holds for every function
        self.poisoned = poisoned or {}
        self.everywhere = everywhere
        by: dict[int, list[WayIn]] = {}
        for w in ways:
            by.setdefault(w.target, []).append(w)
        self._by = {a: tuple(v) for a, v in by.items()}
        self._sorted = sorted(self._by)

    def __len__(self) -> int:
        return len(self._by)

    def between(self, lo: int, hi: int) -> Iterator[tuple[int, tuple[WayIn, ...]]]:
        """(target, ways) of every target in [lo, hi), in address order."""
        i = bisect_left(self._sorted, lo)
        while i < len(self._sorted) and self._sorted[i] < hi:
            a = self._sorted[i]
            yield a, self._by[a]
            i += 1


def _windows_span(pc: int, fstart: int, fend: int) -> tuple[int, int]:
    """[lo, hi) of the bytes a window of the probe at `pc` may cover: [pc - BEFORE,
    pc + AFTER), within its function and the padding around it when its bounds are known
    (before it: a short window's entry stub, which must not land on named bytes)."""
    lo, hi = pc - BEFORE, pc + AFTER
    if fstart < fend:
        lo, hi = max(lo, fstart - 64), min(hi, fend + 64)
    return max(0, lo), hi


class Addresses(Protocol):
    """What the scans ask of a set of addresses (a set[int], or _Regions)."""

    def __contains__(self, a: object) -> bool: ...

    def __iter__(self) -> Iterator[int]: ...

    def intersection(self, values: Iterable[int]) -> set[int]: ...


_BUCKET = 4  # _Regions' coarse set holds a >> _BUCKET for every protected address a


class _Regions:
    """The protected addresses: every probe's `_windows_span`, less the function starts in
    them (a window never leaves its function's bytes), as a set[int] of them would answer
    (the scans' `in`, `intersection`, iteration), without an int object per address: the
    merged spans, the starts inside them, and a set of 16-byte buckets that any protected
    address lies in. A set of every address took 1.3 KB per probe of 100,000 (its 16-byte
    functions each in the windows of two), more than the rest of check at its peak; the
    buckets take a tenth of it, and `intersection` tests the values against them in C as it
    did against the set, then exactly only those in a bucket."""

    def __init__(self, sites: list[tuple[int, int, int]], starts: list[int]) -> None:
        spans = _spans(sites, 1)
        self.los = [lo for lo, _hi in spans]
        self.his = [hi for _lo, hi in spans]
        self.holes: set[int] = set()
        self.buckets: set[int] = set()
        for lo, hi in spans:
            i = bisect_left(starts, lo)
            while i < len(starts) and starts[i] < hi:
                self.holes.add(starts[i])
                i += 1
            self.buckets.update(range(lo >> _BUCKET, ((hi - 1) >> _BUCKET) + 1))

    def __contains__(self, a: object) -> bool:
        if not isinstance(a, int) or a >> _BUCKET not in self.buckets:
            return False
        i = bisect_right(self.los, a) - 1
        return i >= 0 and a < self.his[i] and a not in self.holes

    def __iter__(self) -> Iterator[int]:
        for lo, hi in zip(self.los, self.his, strict=True):
            yield from (a for a in range(lo, hi) if a not in self.holes)

    def intersection(self, values: Iterable[int]) -> set[int]:
        values = values if isinstance(values, list) else list(values)
        near = compress(values, map(self.buckets.__contains__,
                                    map(rshift, values, repeat(_BUCKET))))
        return {a for a in near if a in self}


def _regions(sites: list[tuple[int, int, int]], starts: list[int]) -> _Regions:
    """The protected addresses (_Regions)."""
    return _Regions(sites, starts)


def _spans(sites: list[tuple[int, int, int]], gap: int) -> list[tuple[int, int]]:
    """Sorted [lo, hi) ranges covering every protected address (`_regions`), ranges less than
    `gap` apart merged."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(_windows_span(*site) for site in set(sites)):
        if lo >= hi:
            continue
        if out and lo - out[-1][1] < gap:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


def code_ranges(image: ElfImage) -> list[tuple[int, int, int]]:
    """(vaddr, file offset, size) of the executable bytes the file holds: SHF_EXECINSTR
    sections, else the executable PT_LOADs (a file without section headers); each clipped to
    the end of the file (a damaged header may claim more)."""
    out: list[tuple[int, int, int]] = []
    secs = [(s.addr, s.offset, s.size) for s in image.sections
            if s.flags & SHF_EXECINSTR and s.type != SHT_NOBITS and s.allocated]
    if not secs:
        secs = [(g.vaddr, g.offset, g.filesz) for g in image.segments
                if g.type == PT_LOAD and g.flags & PF_X]
    for vaddr, off, claimed in secs:
        size = min(claimed, len(image.data) - off)
        if off >= 0 and size > 0:
            out.append((vaddr, off, size))
    return out


def _rel32_hits(data: bytes, vaddr: int, opcode_at: list[int], head: int,
                protected: Addresses) -> list[tuple[int, int]]:
    """(source vaddr, target) of each rel32 whose opcode ends `head` bytes after each offset
    of `opcode_at` and whose target is protected."""
    limit = len(data) - head - 4
    at = [p for p in opcode_at if p <= limit] if opcode_at and opcode_at[-1] > limit \
        else opcode_at
    disp_at = list(map(add, at, repeat(head)))
    # target = vaddr + offset of the displacement + 4 + the displacement
    targets = list(map(add, map(add, disp_at, repeat(vaddr + 4)),
                       map(_FIRST, map(_S32.unpack_from, repeat(data), disp_at))))
    hits = protected.intersection(targets)
    if not hits:
        return []
    return [(vaddr + at[i], targets[i])
            for i in compress(range(len(targets)), map(hits.__contains__, targets))]


_FIRST = itemgetter(0)
# (opcode pattern, bytes from the opcode's first byte to the displacement, name)
# (the branches: every opcode whose operand iced-x86 knows as a near branch target in 64-bit
# code, tests/test_analysis_relative.py holds the list to iced's operand kinds)
REL32_OPCODES = ((rb"\xe8", 1, "call"), (rb"\xe9", 1, "jmp"), (rb"\x0f[\x80-\x8f]", 2, "jcc"),
                  (rb"\xc7\xf8", 2, "xbegin"),
                  (rb"\x8d[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", 2, "lea"))  # lea: mod 00, rm 101
REL8_OPCODE = re.compile(rb"[\xeb\x70-\x7f\xe0-\xe3]")  # jmp, jcc, loop*/jrcxz rel8
REL16_OPCODE = re.compile(rb"\x66\xc7\xf8")  # xbegin rel16 (the 66 prefix)
CHUNK = 1 << 18  # sources per prefilter pattern
_WIDE = 1 << 12  # more allowed high halves than this: the prefilter would not pay


class Reach:
    """Which upper halves of a rel32 displacement can take an instruction into `spans` (sorted
    [lo, hi) ranges), asked once per chunk of sources: `halves`."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        spans = [(lo, hi) for lo, hi in spans if lo < hi]  # nothing lands in an empty one
        self.spans = spans
        self.los = [lo for lo, _hi in spans]
        self.top: list[int] = []  # the largest hi of spans[:i + 1]
        for _lo, hi in spans:
            self.top.append(max(hi, self.top[-1]) if self.top else hi)

    def halves(self, emin: int, emax: int) -> set[int]:
        """The upper 16 bits (unsigned) of every rel32 displacement that takes an instruction
        ending in [emin, emax] into one of the spans. Span by span, or (where a span list is
        longer than the halves there are to test: a chunk asked of every span made the index
        of a million-probe file quadratic) half by half: a half h is one when the targets it
        reaches, [(h << 16) + emin, (h << 16) + 0xFFFF + emax], meet a span."""
        if not self.spans:
            return set()
        first = max((self.los[0] - emax) >> 16, -(1 << 15))
        last = min((self.top[-1] - 1 - emin) >> 16, (1 << 15) - 1)
        if last - first + 1 >= len(self.spans):
            return high_halves(self.spans, emin, emax)
        out: set[int] = set()
        los, top = self.los, self.top
        for h in range(first, last + 1):
            base = h << 16
            j = bisect_right(los, base + 0xFFFF + emax) - 1
            if j >= 0 and top[j] - 1 >= base + emin:
                out.add(h & 0xFFFF)
        return out


def high_halves(spans: list[tuple[int, int]], emin: int, emax: int) -> set[int]:
    """Reach.halves span by span (any list of spans)."""
    out: set[int] = set()
    for lo, hi in spans:
        if lo >= hi:
            continue
        dlo, dhi = max(lo - emax, -(1 << 31)), min(hi - 1 - emin, (1 << 31) - 1)
        if dlo <= dhi:
            out.update(h & 0xFFFF for h in range(dlo >> 16, (dhi >> 16) + 1))
    return out


_LITERAL = [re.escape(bytes([v])) for v in range(256)]  # (raw bytes compile faster than \\x..)


def _byte_class(values: Iterable[int]) -> bytes:
    """A regex character class of the byte values `values`."""
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return b"[" + b"".join(_LITERAL[a] + b"-" + _LITERAL[b] if a < b else _LITERAL[a]
                           for a, b in runs) + b"]"


def _prefilter(opcode: bytes, halves: set[int]) -> re.Pattern[bytes]:
    """`opcode` followed by a displacement whose upper half is one of `halves` (the bytes
    after the opcode: d0 d1 d2 d3, little-endian)."""
    by_top: dict[int, list[int]] = {}
    for h in halves:
        by_top.setdefault(h >> 8, []).append(h & 0xFF)
    alts = b"|".join(_byte_class(lows) + _LITERAL[top] for top, lows in sorted(by_top.items()))
    return re.compile(opcode + b"(?=..(?:" + alts + b"))", re.S)


def _halves_pattern(halves: set[int]) -> re.Pattern[bytes]:
    """A pattern matching the third byte of each 4 little-endian bytes whose upper half (bytes
    2 and 3) may be one of `halves`: a superset (any of their low bytes followed by any of
    their high bytes), one byte long so that overlapping candidates all match, and a byte
    class first, which the search skips along quickly."""
    return re.compile(_byte_class({h & 0xFF for h in halves}) + b"(?="
                      + _byte_class({h >> 8 for h in halves}) + b")", re.S)


def _candidates(data: bytes, vaddr: int, opcode: bytes, head: int,
                spans: list[tuple[int, int]]) -> list[int]:
    """Offsets in `data` of each `opcode` whose rel32 (`head` bytes on) may land in `spans`:
    a superset of those that do, found chunk by chunk with a pattern that also matches the
    displacement's upper half against the halves that can reach a span from the chunk."""
    out: list[int] = []
    plain: re.Pattern[bytes] | None = None
    reach = Reach(sorted(spans))
    for c0 in range(0, len(data), CHUNK):
        c1 = min(c0 + CHUNK, len(data))
        # displacement ends: vaddr + q + head + 4 for the opcode offsets q in [c0, c1)
        halves = reach.halves(vaddr + c0 + head + 4, vaddr + c1 - 1 + head + 4)
        if not halves:
            continue
        if len(halves) > _WIDE:
            plain = plain or re.compile(opcode, re.S)
            pat = plain
        else:
            pat = _prefilter(opcode, halves)
        # the end keeps every match's opcode within [c0, c1)
        out.extend(map(re.Match.start, pat.finditer(data, c0, min(len(data), c1 + head + 3))))
    return out


def _code_hits(data: bytes, vaddr: int, protected: Addresses,
               spans: list[tuple[int, int]], lea_spans: list[tuple[int, int]] | None = None,
               lea_targets: list[int] | None = None) -> list[tuple[int, str, int]]:
    """(source, name, target) of every rel32 call/jmp, jcc and rip-relative lea in `data`
    whose target is protected: call/jmp by source, then jcc, then lea. With `lea_spans`, the
    targets of the leas that may land there as well are added to `lea_targets` (the one
    search for the opcode serves both)."""
    out: list[tuple[int, str, int]] = []
    for opcode, head, name in REL32_OPCODES:
        if name == "lea" and lea_spans and lea_targets is not None:
            at = _candidates(data, vaddr, opcode, head, _merged([*spans, *lea_spans]))
            limit = len(data) - head - 4
            at = [q for q in at if q <= limit]
            targets = _rel32_targets(data, vaddr, at, head)
            lea_targets.extend(targets)
            hits = protected.intersection(targets)
            out.extend((vaddr + at[i], name, targets[i])
                       for i in compress(range(len(at)), map(hits.__contains__, targets)))
            continue
        at = _candidates(data, vaddr, opcode, head, spans)
        out.extend((src, name, t) for src, t in _rel32_hits(data, vaddr, at, head, protected))
        if name == "jmp":
            out.sort()
    return out


def _rel32_targets(data: bytes, vaddr: int, at: list[int], head: int) -> list[int]:
    """The target of the rel32 `head` bytes after each offset of `at` (each one fits)."""
    disp = map(_FIRST, map(_S32.unpack_from, repeat(data), map(add, at, repeat(head))))
    return list(map(add, disp, map(add, at, repeat(vaddr + head + 4))))


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping or touching [lo, hi) ranges merged."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


# rip-relative references: (opcode pattern, bytes to the displacement, name)
RIP_REFERENCES = ((rb"\xe8", 1, "call"), (rb"\xe9", 1, "jmp"),
                  (rb"\xff\x15", 2, "call-indirect"), (rb"\xff\x25", 2, "jmp-indirect"),
                  (rb"\x8d[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", 2, "lea"),
                  (rb"\x8b[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", 2, "mov"),
                  (rb"\x3b[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", 2, "cmp"),
                  (rb"\x39[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", 2, "cmp"))


# rip-relative loads (the instruction reads memory at its address): any width, any register
_RIP_MODRM = rb"[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]"
# (opcode pattern, bytes to the displacement, what, bytes of immediate after it): each opens
# with a literal byte, which the search skips along (a class first made it 5-10x slower)
CODE_LOADS = ((rb"\x8b" + _RIP_MODRM, 2, "mov", 0), (rb"\x8a" + _RIP_MODRM, 2, "mov", 0),
              (rb"\x0f[\xb6\xb7\xbe\xbf\x10\x6f\x28]" + _RIP_MODRM, 3, "movzx or vector", 0),
              (rb"\x3b" + _RIP_MODRM, 2, "cmp", 0), (rb"\x39" + _RIP_MODRM, 2, "cmp", 0),
              (rb"\x80\x3d", 2, "cmp imm8", 1), (rb"\x83\x3d", 2, "cmp imm8", 1),
              (rb"\x81\x3d", 2, "cmp imm32", 4))


def code_loads(image: ElfImage, sites: list[tuple[int, int, int]]) -> dict[int, tuple[int, str]]:
    """Address -> (source, what) of each rip-relative load of the file's code (a mov, a
    compare, a movzx or sign extension, a vector load) whose address lies in the
    bytes a window of `sites` may cover, function starts included: code read as data (the
    documented assumption `code-not-read`: the bytes differ after a rewrite). A byte match:
    the caller checks that an instruction starts at the source and reads that address."""
    if not sites:
        return {}
    regions = _Regions(sites, [])
    spans = _spans(sites, CHUNK)
    out: dict[int, tuple[int, str]] = {}
    for vaddr, off, size in code_ranges(image):
        data = bytes(image.data[off:off + size])
        for opcode, head, name, imm in CODE_LOADS:
            at = [q for q in _candidates(data, vaddr, opcode, head, spans)
                  if q <= len(data) - head - 4]
            targets = [t + imm for t in _rel32_targets(data, vaddr, at, head)]
            hits = regions.intersection(targets)
            for q, t in zip(at, targets, strict=True):
                if t in hits:
                    out.setdefault(t, (vaddr + q, name))
    return out


def references_to(image: ElfImage, targets: set[int],
                  names: Iterable[str] | None = None,
                  spans: list[tuple[int, int]] | None = None) -> list[tuple[int, str, int]]:
    """(source, name, target) of every byte sequence of the file's code that is a call or jmp
    rel32, a `call`/`jmp *disp(%rip)`, or a rip-relative `lea`/`mov` (only the kinds
    `names` of RIP_REFERENCES, when given) whose address is one of `targets` (bytes: the
    caller checks that an instruction starts there). One search per opcode (a literal
    first byte lets the search skip along), by source. `spans`: sorted ranges that cover
    `targets` (else made from each target: slower for many)."""
    out: list[tuple[int, str, int]] = []
    wanted = [r for r in RIP_REFERENCES if names is None or r[2] in frozenset(names)]
    if not targets or not wanted:
        return out
    if spans is None:
        spans = _spans([(t, t, t) for t in targets], CHUNK)
    for vaddr, off, size in code_ranges(image):
        data = bytes(image.data[off:off + size])
        for opcode, head, name in wanted:
            at = _candidates(data, vaddr, opcode, head, spans)
            out.extend((src, name, t) for src, t in _rel32_hits(data, vaddr, at, head, targets))
    return sorted(out)


_LABEL = {"call": "call rel32", "jmp": "jmp rel32", "jcc": "jcc rel32", "xbegin": "xbegin rel32",
          "lea": "rip-relative lea"}


def _scan_code(image: ElfImage, protected: Addresses, probes: list[tuple[int, int, int]],
               lea_spans: list[tuple[int, int]] | None = None,
               lea_targets: list[int] | None = None) -> list[WayIn]:
    out: list[WayIn] = []
    ranges = code_ranges(image)
    reach = _spans(probes, CHUNK)
    for vaddr, off, size in ranges:
        data = bytes(image.data[off:off + size])
        for src, name, t in _code_hits(data, vaddr, protected, reach, lea_spans, lea_targets):
            kind = ADDRESS_TAKEN if name == "lea" else XBEGIN if name == "xbegin" else \
                BRANCH_REL32
            out.append(WayIn(t, kind, src, f"{_LABEL[name]} at {src:#x}"))
    # rel8: only sources within reach of a probe's region and outside its function (whose
    # own jumps its disassembly knows)
    spans: set[tuple[int, int]] = set()
    for pc, fstart, fend in probes:
        lo, hi = pc - BEFORE - 130, pc + AFTER + 128
        spans.update(((lo, min(hi, fstart)), (max(lo, fend), hi)) if fstart < fend
                     else ((lo, hi),))
    for lo, hi in sorted(spans):
        for vaddr, off, size in ranges:
            a, b = max(lo, vaddr), min(hi, vaddr + size)
            if b - 1 <= a:
                continue
            for m in REL8_OPCODE.finditer(image.data, off + a - vaddr, off + b - 1 - vaddr):
                src = vaddr + m.start() - off
                d = image.data[m.start() + 1]
                t = src + 2 + (d - 256 if d > 127 else d)
                if t in protected:
                    out.append(WayIn(t, BRANCH_REL8, src, f"rel8 branch at {src:#x}"))
    # rel16 (xbegin with the 66 prefix): a literal search of the code, each match's target
    for vaddr, off, size in ranges:
        for m in REL16_OPCODE.finditer(image.data, off, off + size - 4):
            src = vaddr + m.start() - off
            (d,) = struct.unpack_from("<h", image.data, m.end())
            t = src + 5 + d
            if t in protected:
                out.append(WayIn(t, XBEGIN, src, f"xbegin rel16 at {src:#x}"))
    return out


def code_words_of(image: ElfImage, targets: set[int]) -> list[WayIn]:
    """Every absolute value of a fixed-address file (a word in data, an immediate in code)
    that is one of `targets` (none in a position-independent file)."""
    return _scan_words(image, targets)


def relocations_to(image: ElfImage, targets: set[int]) -> list[WayIn]:
    """Every relocation of the loader's tables whose value is one of `targets` (a code
    pointer the loader stores: its place is the way in's `source`)."""
    return _scan_relocations(image, targets)


def _scan_relocations(image: ElfImage, protected: Addresses) -> list[WayIn]:
    """Every relocation the loader applies (usdtpatch.elf.model.loader_relocations: DT_RELA,
    DT_REL, DT_JMPREL, DT_RELR and the allocated SHT_RELA/SHT_REL/SHT_RELR sections) whose
    value lands in a region: a relative one's (RELATIVE, IRELATIVE, a RELR entry: base +
    addend, the addend of a REL or RELR entry being the word at its place), a symbol one's
    (S + A), by the model's meaning of its type; and the code addresses the dynamic section
    names (DT_INIT, DT_FINI). A kept static table (--emit-relocs) is not the loader's: it
    describes bytes the code and word scans read as they are."""
    out: list[WayIn] = []
    if not image.is64 or not image.little_endian or sys.byteorder != "little":
        return out
    rel = loader_relocations(image)
    addends, types = rel.addends, rel.types
    hit = protected.intersection(addends)
    symvals = [_symbol_values(image, t.symtab) for t in rel.tables]
    n = len(rel)
    # the relative ones whose addend is protected, and every symbol relocation, in order
    todo = sorted({*compress(range(n), map(hit.__contains__, addends)),
                   *compress(range(n), map(_SYMBOL_VALUED.__contains__, types))})
    for i in todo:
        rtype, place = types[i], rel.places[i]
        if rtype in _RELATIVE_VALUED:
            if addends[i] in hit:
                out.append(WayIn(addends[i], RELOCATION, place, f"{rel.name(i)} at {place:#x}"))
        elif rtype in _SYMBOL_VALUED and rel.symbols[i]:
            value = symvals[rel.table[i]](rel.symbols[i])
            if value is not None and value + addends[i] in protected:
                out.append(WayIn(value + addends[i], RELOCATION, place,
                                 f"{rel.name(i)} at {place:#x}"))
    dyn = dynamic_segment(image)
    for tag, value, off in dynamic_entries(image):
        if tag in CODE_ADDRESS_TAGS and value in protected and dyn is not None:
            at = dyn.vaddr + off - dyn.offset
            out.append(WayIn(value, RELOCATION, at, f"{DYNAMIC_TAGS[tag].name} at {at:#x}"))
    return out


_RELATIVE_VALUED = frozenset({RELR, *(t for t, r in RELOCATION_TYPES.items()
                                      if r.value in ("relative", "ifunc"))})
_SYMBOL_VALUED = frozenset(t for t, r in RELOCATION_TYPES.items() if r.value == "symbol")


def _symbol_values(image: ElfImage, link: int) -> Callable[[int], int | None]:
    """A function: symbol index -> its defined value in the symbol table `link`, or None."""
    secs = image.sections
    tab = secs[link] if 0 < link < len(secs) else None
    cache: dict[int, int | None] = {}

    def value(i: int) -> int | None:
        if tab is None:
            return None
        got = cache.get(i, -1)
        if got != -1:
            return got
        at = tab.offset + i * 24
        val: int | None = None
        if at + 24 <= min(len(image.data), tab.offset + tab.size):
            _n, _info, _other, shndx, v, _size = struct.unpack_from("<IBBHQQ", image.data, at)
            val = v if shndx != 0 else None
        cache[i] = val
        return val

    return value


def _scan_words(image: ElfImage, protected: Addresses) -> list[WayIn]:
    """Absolute values of a fixed-address file, at any byte of any allocated section: a word
    in data, an immediate (`mov $imm32`, `push imm32`, `movabs`) or absolute displacement in
    code. A position-independent file holds no usable absolute code address in its bytes:
    the loader stores each one through a relocation (_scan_relocations)."""
    out: list[WayIn] = []
    if not image.little_endian or sys.byteorder != "little" or image.type != ET_EXEC:
        return out
    small = {a for a in protected if a < 1 << 32}
    big = {a for a in protected if a >= 1 << 32}
    for sec in image.sections:
        if not sec.allocated or sec.type == SHT_NOBITS or not sec.size or \
                sec.offset + sec.size > len(image.data):
            continue
        code = bool(sec.flags & SHF_EXECINSTR)
        for size, want in ((4, small), (8, big)):
            for place, value in _values_in(image.data, sec.offset, sec.size, size, want):
                at = sec.addr + place - sec.offset
                where = f"in {sec.name or 'code' if code else sec.name or 'data'}"
                out.append(WayIn(value, CODE_WORD if code else DATA_WORD, at,
                                 f"{size}-byte value at {at:#x} {where}"))
    return out


def _values_in(data: bytes | mmap, off: int, size: int, width: int,
               want: set[int]) -> list[tuple[int, int]]:
    """(file offset, value) of every little-endian `width`-byte value at any byte of
    data[off:off + size] that is in `want`: a pattern on the two bytes holding the value's
    bits 16..31 finds the candidates, which are then read exactly."""
    if not want or size < width:
        return []
    halves = {(a >> 16) & 0xFFFF for a in want}
    fmt = "<I" if width == 4 else "<Q"
    out: list[tuple[int, int]] = []
    if len(halves) > _WIDE:
        found: Iterable[int] = range(off, off + size - width + 1)
    else:
        # the search ends a byte after the last candidate's byte 3, which the pattern's
        # lookahead reads (an end at that byte hid the section's last word)
        last = off + size - width
        found = (q for q in (m.start() - 2 for m in
                             _halves_pattern(halves).finditer(data, off + 2, last + 4))
                 if q <= last)
    for q in found:
        (v,) = struct.unpack_from(fmt, data, q)
        if v in want:
            out.append((q, v))
    return out


def _table_sections(image: ElfImage) -> list[tuple[int, int, int]]:
    """(vaddr, file offset, size) of the sections a relative jump table may be in: allocated
    non-executable PROGBITS (`.rodata`, `.data.rel.ro`, ...), less the unwind tables."""
    out: list[tuple[int, int, int]] = []
    for sec in image.sections:
        if (sec.allocated and sec.type == SHT_PROGBITS and not sec.flags & SHF_EXECINSTR
                and sec.name not in (".eh_frame", ".eh_frame_hdr") and sec.size
                and sec.offset >= 0 and sec.offset + sec.size <= len(image.data)):
            out.append((sec.addr, sec.offset, sec.size))
    return out


def _table_words(image: ElfImage, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(address A, int32 value E) of every word of `_table_sections`, at any byte, that would
    land in `spans` as the entry of a relative table at most TABLE_BYTES before it, or as a
    place-relative word (A + E in [lo - PLACE_ADDEND, hi + TABLE_BYTES) for a span [lo, hi)).
    The words are found by the prefilter on their upper half, then checked exactly."""
    wide = _merged((lo - PLACE_ADDEND, hi + TABLE_BYTES) for lo, hi in spans)
    pages: set[int] = set()
    for lo, hi in wide:
        pages.update(range(lo >> 12, ((hi - 1) >> 12) + 1))
    los = [lo for lo, _hi in wide]
    out: list[tuple[int, int]] = []
    data = image.data
    reach = Reach(wide)
    for vaddr, off, size in _table_sections(image):
        for c0 in range(0, size - 3, CHUNK):
            c1 = min(c0 + CHUNK, size - 3)
            halves = reach.halves(vaddr + c0, vaddr + c1 - 1)
            if not halves:
                continue
            if len(halves) > _WIDE:
                at = list(range(off + c0, off + c1))
            else:
                # (the end reaches the byte the lookahead reads of the chunk's last word)
                at = [q for q in (m.start() - 2 for m in _halves_pattern(halves).finditer(
                    data, off + c0 + 2, off + c1 + 3)) if q < off + c1]
            # A + E, A = vaddr + q - off: kept when its 4 KiB page is one of a wide span's
            ends = list(map(add, map(_FIRST, map(_S32.unpack_from, repeat(data), at)),
                            map(add, at, repeat(vaddr - off))))
            for i in compress(range(len(at)), map(pages.__contains__,
                                                  map(rshift, ends, repeat(12)))):
                j = bisect_right(los, ends[i]) - 1
                if j >= 0 and ends[i] < wide[j][1]:
                    a = vaddr + at[i] - off
                    out.append((a, ends[i] - a))
    return out


def _switch_entries(image: ElfImage, words: list[tuple[int, int]], lea_targets: list[int],
                    code: list[tuple[int, int]]) -> set[int]:
    """The addresses of `words` that are read as entries of a compiler's relative jump table
    rather than as place-relative words: in `.rodata` (or `.rodata.*`), where gcc and clang
    put switch tables, at a multiple of 4 less than TABLE_BYTES after a rip-relative `lea`
    target T (the table's base, T below the word) with T + W in code. (The same bytes read
    as `.long x - .` name x + 4i, i the entry's index: a static glibc's switch tables named
    instructions of main that way.) Words elsewhere, or that no table explains, stay
    place-relative."""
    rodata = [(s.addr, s.addr + s.size) for s in image.sections if s.allocated and (
        s.name == ".rodata" or s.name.startswith(".rodata."))]
    if not rodata:
        return set()
    bases = sorted(set(lea_targets))
    out: set[int] = set()
    for a, e in words:
        if not any(lo <= a < hi for lo, hi in rodata):
            continue
        i = bisect_right(bases, a) - 1  # the nearest base at or below the word
        if i < 0 or a - bases[i] >= TABLE_BYTES or (a - bases[i]) % 4:
            continue
        t = bases[i] + e
        j = bisect_right(code, (t, 1 << 64)) - 1
        if j >= 0 and code[j][0] <= t < code[j][1]:
            out.add(a)
    return out


def _scan_place_relative(image: ElfImage, words: list[tuple[int, int]], regions: _Regions
                         ) -> tuple[list[WayIn], dict[int, tuple[int, str]]]:
    """The place-relative words among `words` (`_table_words`: every int32 at any byte of
    an allocated non-code section, `.eh_frame` aside, whose A + W lands near a region): a
    word W at A that holds a code address less its own (`.long target - .`: a static key's
    `__jump_table` entry built with `asm goto`, a kernel-style `__ex_table` of fault fixups,
    a 64-bit `.quad target - .`, whose low half is such a word) names A + W + k for
    |k| <= PLACE_ADDEND. Each one that lands in a region is a way in (one with k != 0 only
    where an instruction starts: CodeContext's function analysis); and (address -> what) of
    those that name an address exactly (k = 0), function starts included (`WaysIn.named`)."""
    out: list[WayIn] = []
    named: dict[int, tuple[int, str]] = {}
    secs = sorted((s.addr, s.addr + s.size, s.name) for s in image.sections if s.allocated)
    los = [a for a, _e, _n in secs]
    for a, e in words:
        for k in range(-PLACE_ADDEND, PLACE_ADDEND + 1):
            t = a + e + k
            inside = t in regions
            if not inside and (k or t not in regions.holes):
                continue
            i = bisect_right(los, a) - 1
            sec = secs[i][2] if i >= 0 and a < secs[i][1] else "data"
            what = (f"place-relative word at {a:#x} in {sec or 'data'}: {a:#x} + ({e:#x})"
                    f"{f' {k:+d}' if k else ''} = {t:#x}")
            if not k:
                named.setdefault(t, (a, what))
            if inside:
                out.append(WayIn(target=t, kind=PLACE_RELATIVE, source=a, what=what, base=k))
    return out, named


def _table_reach(words: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Where the base of a table holding one of `words` can be: up to TABLE_BYTES before."""
    return _merged((max(0, a - TABLE_BYTES), a + 1) for a, _e in words)


def _scan_tables(words: list[tuple[int, int]], lea_targets: list[int],
                 protected: Addresses) -> list[WayIn]:
    """The entries of 4-byte relative jump tables (any function's) that land in a region.
    A table starts at the target T of a rip-relative `lea` (a PIC switch's table base) and
    ends at the next such target or TABLE_BYTES on; an entry at A (A - T a multiple of 4)
    holding E goes to T + E. `words` are `_table_words`'s, `lea_targets` every lea target in
    their `_table_reach` (and others)."""
    bases = sorted(set(lea_targets))
    out: list[WayIn] = []
    for a, e in words:
        i = bisect_right(bases, a) - 1
        t = bases[i] if i >= 0 else -TABLE_BYTES
        if a - t < TABLE_BYTES and (a - t) % 4 == 0 and t + e in protected:
            out.append(WayIn(target=t + e, kind=REL_TABLE, source=a,
                             what=f"4-byte entry at {a:#x} of the table at {t:#x} (its "
                                  f"address is taken by a rip-relative lea)", base=t))
    return out


def scan_code_tables(image: ElfImage, lea_targets: list[int], starts: list[int],
                      protected: Addresses) -> list[WayIn]:
    """The entries of 4-byte relative tables placed in code that land in a region. A table
    starts at the target T of a rip-relative `lea` that lies in code and is no function
    start (`starts`: the bytes at a function start are its first instruction), and ends at
    the next `lea` target, TABLE_BYTES on, or the end of its code range; its int32 entries
    at T, T + 4, ... go to T + E. The caller drops those whose bytes decoding shows to be
    instructions (CodeContext.decoded_as_code)."""
    out: list[WayIn] = []
    if not image.little_endian or sys.byteorder != "little":
        return out
    bases = sorted(set(lea_targets))
    for vaddr, off, size in code_ranges(image):
        for k in range(bisect_left(bases, vaddr), bisect_left(bases, vaddr + size)):
            t = bases[k]
            i = bisect_left(starts, t)
            if i < len(starts) and starts[i] == t:
                continue
            end = min(t + TABLE_BYTES, vaddr + size, *bases[k + 1:k + 2])
            out.extend(_code_table(image.data, t, off + t - vaddr, (end - t) // 4, protected))
    return out


def _code_table(data: bytes | mmap, t: int, at: int, n: int,
                protected: Addresses) -> Iterator[WayIn]:
    """The entries of the `n`-entry table at `t` (file offset `at`) that land in a region."""
    ends = list(map(add, memoryview(data)[at:at + 4 * n].cast("i").tolist(), repeat(t)))
    hits = protected.intersection(ends)
    for i in compress(range(len(ends)), map(hits.__contains__, ends)) if hits else ():
        a = t + 4 * i
        yield WayIn(target=ends[i], kind=REL_TABLE, source=a,
                    what=f"4-byte entry at {a:#x} of the table in code at {t:#x} (its "
                         f"address is taken by a rip-relative lea)", base=t)


def _scan_landing_pads(image: ElfImage, cfi: CfiIndex, protected: Addresses) -> list[WayIn]:
    """Every landing pad in a region that the LSDA of any FDE names. Only the FDEs whose CIE
    has an LSDA encoding are parsed: the CIE pointer of each is read first."""
    out: list[WayIn] = []
    fdes = cfi.fde_addresses
    if not fdes or not _may_have_lsda(image):
        return out
    seg = image.load_segment_for(fdes[0])
    if seg is None or not seg.contains_vaddr(fdes[-1]) or min(fdes) < seg.vaddr or \
            max(fdes) + 8 > seg.vaddr + min(seg.filesz, len(image.data) - seg.offset):
        return _landing_pads_of(image, cfi, range(len(fdes)), protected)
    heads = list(map(_HEAD.unpack_from, repeat(image.data),
                     map(add, fdes, repeat(seg.offset - seg.vaddr))))
    # (a 64-bit DWARF FDE, length 0xffffffff, is parsed whatever its CIE)
    cie_at = [fa + 4 - cid if length != 0xFFFFFFFF else -1
              for fa, (length, cid) in zip(fdes, heads, strict=True)]
    capable: set[int] = {-1}
    cies: dict[int, Cie] = {}
    for c in set(cie_at) - {-1}:
        try:
            cie = parse_cie(image, c, cies)
        except CfiError:
            capable.add(c)  # unreadable: let the FDE's parse say
            continue
        if "L" in cie.augmentation and cie.lsda_encoding != 0xFF:
            capable.add(c)
    todo = [i for i, c in enumerate(cie_at) if c in capable]
    return _landing_pads_of(image, cfi, todo, protected)


_HEAD = struct.Struct("<II")  # an FDE's length and CIE pointer
# a CIE's head: CIE id 0, version 1 or 3, an augmentation string "z..." naming an LSDA
_CIE_WITH_L = re.compile(rb"\0\0\0\0[\x01\x03]z[A-Za-z]*L")


def _may_have_lsda(image: ElfImage) -> bool:
    """False when `.eh_frame` holds no CIE whose augmentation names an LSDA (then no FDE has
    one); True when it may, or when the file has no `.eh_frame` section to look in."""
    sec = image.section(".eh_frame")
    if sec is None or sec.type == SHT_NOBITS or sec.offset + sec.size > len(image.data):
        return True
    return _CIE_WITH_L.search(image.data, sec.offset, sec.offset + sec.size) is not None


def _landing_pads_of(image: ElfImage, cfi: CfiIndex, which: Iterable[int],
                     protected: Addresses) -> list[WayIn]:
    out: list[WayIn] = []
    for i in which:
        try:
            fde = cfi.fde_at(i)
            if fde.lsda is None or foreign_personality(image, fde.cie) is not None:
                continue  # none, or not GCC's format: its function's analysis refuses it
            pads = parse_lsda(image, fde.lsda, fde.pc_begin).landing_pads
        except CfiError:
            continue  # an LSDA that does not parse: its own function's analysis says so
        out.extend(WayIn(lp, LANDING_PAD, fde.lsda, f"landing pad of the LSDA at "
                         f"{fde.lsda:#x} (of the FDE at {fde.pc_begin:#x})")
                   for lp in pads if lp in protected)
    return out


def build_ways_in(image: ElfImage, probes: Iterable[tuple[int, int, int]],
                  starts: list[int], cfi: CfiIndex | None = None) -> WaysIn:
    """The file-wide index for `probes`: (link-time pc, start, end of its function; start ==
    end when unknown); `starts` are the function starts (FDE starts and symbols), sorted;
    `cfi` the file's FDEs (their LSDAs' landing pads)."""
    sites = list(probes)
    if not sites:
        return WaysIn(())
    protected = _regions(sites, starts)
    pads = _scan_landing_pads(image, cfi, protected) if cfi is not None else []
    words = _table_words(image, _spans(sites, 1))
    leas: list[int] = []
    code_spans = [(v, v + n) for v, _o, n in code_ranges(image)]
    code = _scan_code(image, protected, sites, [*_table_reach(words), *code_spans], leas)
    switch = _switch_entries(image, words, leas, sorted(code_spans))
    placed, named = _scan_place_relative(image, [w for w in words if w[0] not in switch],
                                         protected)
    return WaysIn([*code, *_scan_relocations(image, protected), *_scan_words(image, protected),
                   *_scan_tables(words, leas, protected),
                   *scan_code_tables(image, leas, starts, protected), *pads, *placed],
                  named=named)
