"""Equivalence of a relocated window and its detour, checked by running both in unicorn.

For each of many random initial states (registers, flags, stack and every page the code
touches filled with seeded pseudo-random bytes), the original window runs from its first
instruction until control leaves it, and the rewritten code runs from the same address (the
`jmp` to the detour) until control leaves the window and the detour. Both must leave to the
same address with the same general registers, flags and vector registers, the same memory
written, and must reach the probe the same number of times with the same registers there (so a
tracer reads the same argument values).

Loops: a run also stops where control first comes back to an instruction it already ran (in
the original's addresses: a detour's copy of an instruction counts as that instruction, the
rewritten window's `jmp` as its start). A `while (1)` around the probe never leaves its
window; both runs are compared at that back edge like at an exit.

Faults: a state in which the original faults is judged on what it shows: the rewrite must
fault at the copy of the same instruction, the same way, with the same probe hits, registers
and memory written before it.

No aliasing: the two machines differ only in the bytes the rewrite changes (the window, the
patched ways in), so a state that reads those bytes as data says nothing about the detour.
Pointer values are drawn from the file's data segments and the stack above the frame being
run (never the code pages, the detour, or the frame below rsp that pushes and the guard
write), code pages and the detour are mapped read-only (a write through a random pointer
faults in both runs), and a state whose run still reads the changed bytes is not judged.

Reference: docs/rewrite.md ("How a site is rewritten"); the rule: "the same exit address,
the same registers and flags, the same memory writes, and the probe reached exactly when the
original nop was reached, with the same registers there". The rewritten code's guard, when
present, lowers rsp by 128 around the NOP: registers are compared at the site's first byte,
before the guard.

Windows that hold a `call` and windows with ways in from outside add shapes:
- a moved call: both runs stop at the callee's entry (it lies outside the window and the
  detour) with the same registers (arguments included) and the same memory, except the return
  address the call pushed, which must be the detour's copy of the original return address;
  then each return site strictly inside the window is run from (the original) and from its
  copy (the detour), and compared like an entry.
- an emulated call pushes the original return address itself: the memory compares equal.
- a retargeted branch: the rewritten machine holds the patched branch (and stub, table entry);
  both run from the branch instruction (a table's target: from the target and its copy) with
  the branch's own bytes allowed, and are compared.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import signal
import struct
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, TypeVar

from usdtpatch.analysis.calls import EMULATED  # the word for the emulator's check
from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.elf.image import PF_W, PF_X, ElfImage
from usdtpatch.errors import UnsupportedError
from usdtpatch.kernelfacts import PAGE
from usdtpatch.lifetime import die_with_parent
from usdtpatch.verification.machine import (
    GPR_NAMES,
    HOOK_CODE,
    HOOK_MEM_READ,
    HOOK_MEM_UNMAPPED,
    HOOK_MEM_WRITE,
    MEM_FETCH_UNMAPPED,
    PROT_CODE,
    REG_NAMES,
    REG_RIP,
    RegReader,
    RegWriter,
    UcError,
    load_segments,
    new_x86_64,
    raw_regs,
)
from usdtpatch.x86.decode import sweep
from usdtpatch.x86.relocate import Detour, jmp_rel8, jmp_rel32

_T = TypeVar("_T")
# verify(image, window, detour, replaced probe addresses) -> None when equivalent, else why
Verifier = Callable[[ElfImage, PatchWindow, Detour, tuple[int, ...]], "str | None"]

RUNS = 64
MAX_INSNS = 2000
STACK_TOP = 0x7FFF_F000_0000
STACK_SIZE = 0x20000
_GPRS = GPR_NAMES
_XMM_COUNT = 16
_STATUS_FLAGS = 0x8D5  # CF PF AF ZF SF OF
_FLAGS_AT = 16 * REG_NAMES.index("rflags")  # offsets in RegReader.read_raw's slots
_RIP_AT = 16 * REG_NAMES.index("rip")
_RSP_AT = 16 * REG_NAMES.index("rsp")


def _read_bytes(uc: Any, addresses: set[int]) -> dict[int, int]:
    """{address: byte} of `addresses`, read a run of consecutive ones at a time."""
    out: dict[int, int] = {}
    run: list[int] = []
    for a in sorted(addresses):
        if run and a != run[-1] + 1:
            out.update(zip(run, uc.mem_read(run[0], len(run)), strict=True))
            run = []
        run.append(a)
    if run:
        out.update(zip(run, uc.mem_read(run[0], len(run)), strict=True))
    return out


def _pattern(page: int, seed: int) -> bytes:
    """The seeded bytes of a page first touched in a run (the same in both machines)."""
    return random.Random((page << 32) ^ seed).randbytes(PAGE)


@dataclass
class _Run:
    exit: int | None = None
    fault: str | None = None
    hits: list[bytes] = field(default_factory=list)
    writes: set[int] = field(default_factory=set)
    steps: int = 0
    # the original address of every instruction run (a detour's copy counts as its original)
    seen: set[int] = field(default_factory=set)
    last: int | None = None  # the original address of the last instruction started
    looped: bool = False  # stopped at a loop's back edge (an instruction run before)
    aliased: bool = False  # read the bytes the rewrite changes: the state says nothing


class _Sandbox:
    """One emulator machine (usdtpatch.verification.machine) holding a file's loadable segments
    (at link-time addresses), with pages outside them filled on demand with seeded patterns."""

    def __init__(self, image: ElfImage) -> None:
        self.uc: Any = new_x86_64()
        self.mapped: set[int] = set()
        self.seed = 0
        self.lazy: set[int] = set()
        for seg in load_segments(image):
            self._map(seg.lo, seg.hi - seg.lo)
            self.uc.mem_write(seg.address, seg.data)
        # code pages are read-only, as in a process: a write through a random pointer into
        # code faults in both runs instead of changing the code one of them then runs
        for lo, hi in code_pages(image):
            self.uc.mem_protect(lo, hi - lo, PROT_CODE)
        self._map(STACK_TOP - STACK_SIZE, STACK_SIZE)
        self.reader = RegReader(self.uc)  # one batch call instead of 33 reg_reads
        self.writer = RegWriter(self.uc)
        self.run: _Run = _Run()
        self.allowed: frozenset[int] = frozenset()  # the addresses a run may execute
        self.probes: set[int] = set()
        self.saved: dict[int, int] = {}
        # the rewritten machine's view: detour address -> the original instruction it copies;
        # addresses in [detour_lo, detour_hi) not in it are the detour's own (site, jmp end)
        self.coord: dict[int, int] = {}
        self.detour_lo = self.detour_hi = 0
        self.patch_jmp: int | None = None  # the rewritten window's start (its `jmp detour`)
        self.stubs: frozenset[int] = frozenset()  # the 8-bit jumps' `jmp rel32` stubs
        self.uc.hook_add(HOOK_MEM_UNMAPPED, self._on_unmapped)
        self.uc.hook_add(HOOK_MEM_WRITE, self._on_write)
        self.uc.hook_add(HOOK_CODE, self._on_code)

    def _map(self, addr: int, size: int) -> None:
        # one mem_map per run of unmapped pages: unicorn's cost per call grows with the
        # number of regions, and a page at a time took ~50 s for libjvm's 30 MB
        run_start: int | None = None
        for page in range(addr, addr + size + PAGE, PAGE):
            free = page < addr + size and page not in self.mapped
            if free and run_start is None:
                run_start = page
            elif not free and run_start is not None:
                self.uc.mem_map(run_start, page - run_start)
                self.mapped.update(range(run_start, page, PAGE))
                run_start = None

    def _on_unmapped(self, uc: Any, _access: int, address: int, _size: int, _value: int,
                     _user: Any) -> bool:
        if _access == MEM_FETCH_UNMAPPED:
            # control left for an unmapped (or non-canonical: unicorn passes a truncated
            # address, rip has the whole one) address, e.g. a `ret` of the window popping a
            # random return address: that is the window's exit, not a fault of the window
            rip = uc.reg_read(REG_RIP)
            if rip not in self.allowed:
                self.run.exit = rip
                return False
        page = address // PAGE * PAGE
        if page >= 1 << 47 or page < 0x10000:
            return False  # a fault, as in a real process
        self._map(page, PAGE)
        self.lazy.add(page)
        uc.mem_write(page, _pattern(page, self.seed))
        return True

    def _on_write(self, uc: Any, _access: int, address: int, size: int, _value: int,
                  _user: Any) -> None:
        for a in range(address, address + size):
            if a // PAGE * PAGE not in self.mapped:
                continue  # the write faults (the hook runs before it): nothing is written
            self.run.writes.add(a)
            if a not in self.saved:
                self.saved[a] = uc.mem_read(a, 1)[0]

    def _on_code(self, uc: Any, address: int, _size: int, _user: Any) -> None:
        run = self.run
        run.steps += 1
        if address not in self.allowed:
            run.exit = address
            uc.emu_stop()
            return
        if run.steps > MAX_INSNS:
            run.fault = "too many instructions (the window loops)"
            uc.emu_stop()
            return
        # A loop inside the window (`while (1)` around the probe) never leaves it: both runs
        # stop where control first comes back to an instruction already run (the back edge,
        # in the original's addresses), and are compared there like at an exit.
        if address == self.patch_jmp:
            where: int | None = None if address not in run.seen else address
            if where is not None:
                run.exit, run.looped = where, True
                uc.emu_stop()
                return
        elif address not in self.stubs:  # a stub is no instruction of the original
            where = self.coord.get(address)
            if where is None and not self.detour_lo <= address < self.detour_hi:
                where = address
            if where is not None:
                if where in run.seen:
                    run.exit, run.looped = where, True
                    uc.emu_stop()
                    return
                run.seen.add(where)
                run.last = where
        if address in self.probes:
            run.hits.append(self.regs())

    def _on_read(self, uc: Any, _access: int, _address: int, _size: int, _value: int,
                 _user: Any) -> None:
        self.run.aliased = True  # a data read of the bytes the rewrite changes
        uc.emu_stop()

    def regs(self) -> bytes:
        """GPRs, status flags, xmm0-15 as RegReader's raw slots, rip's cleared (it differs
        between window and detour) and rflags masked to the status flags: compared as
        bytes, decoded only to say what differs (`_diff`)."""
        raw = bytearray(self.reader.read_raw())
        raw[_RIP_AT:_RIP_AT + 16] = bytes(16)
        flags = int.from_bytes(raw[_FLAGS_AT:_FLAGS_AT + 8], "little") & _STATUS_FLAGS
        raw[_FLAGS_AT:_FLAGS_AT + 8] = flags.to_bytes(8, "little")
        return bytes(raw)

    def execute(self, entry: int, state: bytes, stack: bytes, allowed: frozenset[int],
                probes: set[int], seed: int) -> tuple[_Run, bytes, dict[int, int]]:
        """Run from `entry` with the registers `state` (RegWriter.write_raw's slots)."""
        self.seed = seed
        self.uc.mem_write(STACK_TOP - len(stack), stack)
        self.writer.write_raw(state)
        self.run = _Run()
        self.allowed = allowed
        self.probes = probes
        self.saved = {}
        try:
            self.uc.emu_start(entry, 0, count=MAX_INSNS + 2)
        except UcError as exc:
            if self.run.exit is None:  # else: left through an unmapped fetch (an exit)
                self.run.fault = str(exc)
        final = self.regs()
        memory = _read_bytes(self.uc, self.run.writes)
        for a, old in self.saved.items():  # undo the run's writes
            if a // PAGE * PAGE not in self.lazy:
                self.uc.mem_write(a, bytes([old]))
        # pattern pages depend on the seed: drop them (the next run maps the ones it touches
        # with its own seed) instead of refilling every page ever touched before each run
        for page in self.lazy:
            self.uc.mem_unmap(page, PAGE)
            self.mapped.discard(page)
        self.lazy.clear()
        return self.run, final, memory


@dataclass
class _Pair:
    original: _Sandbox
    rewritten: _Sandbox
    segments: list[tuple[int, int]] = field(default_factory=list)  # loaded data [lo, hi)
    # what no drawn value may point into: the code pages, and the detour being checked
    avoid: list[tuple[int, int]] = field(default_factory=list)

    @property
    def avoid_span(self) -> tuple[int, int]:
        """[lowest, highest) address of `avoid` (a quick test before the exact one)."""
        if not self.avoid:
            return 0, 0
        return min(lo for lo, _ in self.avoid), max(hi for _, hi in self.avoid)


FRAME_BELOW = 0x1000  # bytes below rsp a moved call, the guard or a push may write
FRAME_ABOVE = 0x100  # a stack pointer drawn lies at least this far above rsp


def code_pages(image: ElfImage) -> list[tuple[int, int]]:
    """The pages [lo, hi) of the executable PT_LOADs that no writable one shares."""
    code: set[int] = set()
    data: set[int] = set()
    for seg in load_segments(image):
        pages = range(seg.lo, seg.hi, PAGE)
        if seg.flags & PF_W:
            data.update(pages)
        elif seg.flags & PF_X:
            code.update(pages)
    return _runs(sorted(code - data))


def _runs(pages: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for p in pages:
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + PAGE)
        else:
            out.append((p, p + PAGE))
    return out


_SMALL = (0xFF, 0xFFFF, 0xFFFF_FFFF, 0xFFFF_FFFF)
_MASK64 = (1 << 64) - 1


def _gprs(rng: random.Random, pair: _Pair, rsp: int, count: int = len(GPR_NAMES)
          ) -> list[int]:
    """`count` random register values, each one of: any 64 bits, an address in the stack
    above the frame being run or in a data segment, or a small int; never one inside
    `pair.avoid` (code pages, the detour) or the frame below rsp, whose bytes differ between
    the two runs. Drawn 64 bits at a time from one batch of random bytes (a Random call per
    value was most of the check's time)."""
    low, high = pair.avoid_span
    avoid, segments = pair.avoid, pair.segments
    stack_lo = rsp + FRAME_ABOVE
    stack_span = STACK_TOP - FRAME_ABOVE - stack_lo
    frame_lo, frame_hi = rsp - FRAME_BELOW, rsp + FRAME_ABOVE
    out: list[int] = []
    while len(out) < count:
        for x in struct.unpack("<32Q", rng.randbytes(256)):
            kind, y = x & 3, x >> 2
            if kind == 1:
                v = stack_lo + y % stack_span
            elif kind == 2 and segments:
                lo, hi = segments[y % len(segments)]
                v = lo + (y >> 8) % max(1, hi - lo)
            elif kind == 3:
                v = (y >> 2) & _SMALL[y & 3]
            else:
                v = (x ^ (x >> 31)) & _MASK64  # any 64 bits (the low two mixed in again)
            if frame_lo <= v < frame_hi or \
                    (low <= v < high and any(lo <= v < hi for lo, hi in avoid)):
                continue
            out.append(v)
            if len(out) == count:
                break
    return out


_SLOTS = struct.Struct("<" + "Q8x" * (len(GPR_NAMES) + 1))  # GPRs, rflags: 16-byte slots
STACK_BYTES = 0x8000  # the random stack written below STACK_TOP for each state
STACK_POOL = 0x20000  # random bytes a site's states take their stacks from


def _draw_state(rng: random.Random, pair: _Pair, pool: bytes) -> tuple[bytes, bytes]:
    """One random initial state: the registers as RegWriter.write_raw's slots (GPRs, rflags,
    xmm0-15) and the stack's bytes. A fully random register is almost never a mappable
    address, so a window that loads through one would fault in nearly every state: pointers
    into the stack above the frame and the file's data segments, and small values, are
    mixed in (`_gprs`). The stack is a slice of `pool` at a random offset (drawing 32 KiB
    of random bytes per state was half the check's time)."""
    rsp = STACK_TOP - 0x4000 - 8 * rng.randrange(256)
    gprs = _gprs(rng, pair, rsp)
    gprs[_GPRS.index("rsp")] = rsp
    flags = (rng.getrandbits(12) & _STATUS_FLAGS) | 0x2
    state = _SLOTS.pack(*gprs, flags) + rng.randbytes(16 * _XMM_COUNT)
    at = rng.randrange(len(pool) - STACK_BYTES)
    return state, pool[at:at + STACK_BYTES]


def _new_pair(image: ElfImage) -> _Pair:
    code = code_pages(image)
    data = [(seg.address, seg.address + seg.memsz) for seg in load_segments(image)
            if not seg.flags & PF_X]
    return _Pair(_Sandbox(image), _Sandbox(image), data, code)


class DetourVerifier:
    """The verifier of one rewrite: its two machines are made for the first image it is asked
    about and kept for the next detours of that image (no state outlives the object)."""

    def __init__(self, runs: int = RUNS, seed: int = 1) -> None:
        self.runs = runs
        self.seed = seed
        self._image: ElfImage | None = None
        self._pair: _Pair | None = None

    def __call__(self, image: ElfImage, window: PatchWindow, detour: Detour,
                 probes: tuple[int, ...], *, patches: tuple[tuple[int, bytes], ...] = (),
                 entries: tuple[tuple[int, int], ...] = ()) -> str | None:
        if self._pair is None or self._image is not image:
            self._image, self._pair = image, _new_pair(image)
        return _verify(self._pair, image, window, detour, probes, self.runs, self.seed,
                       patches, entries)


def verify_detour(image: ElfImage, window: PatchWindow, detour: Detour,
                  probes: tuple[int, ...], runs: int = RUNS, seed: int = 1, *,
                  patches: tuple[tuple[int, bytes], ...] = (),
                  entries: tuple[tuple[int, int], ...] = ()) -> str | None:
    """None when the detour behaves like the window in `runs` random states, else why not.

    `patches` (vaddr, bytes): the retargeted ways in, written in the rewritten machine; each
    source is also run. `entries` (original, rewritten): more entry points to compare (the
    ways in, the moved calls' return sites).
    One-shot: new machines for this call (a rewrite uses one DetourVerifier for all sites)."""
    return _verify(_new_pair(image), image, window, detour, probes, runs, seed, patches,
                   entries)


def _verify(pair: _Pair, image: ElfImage, window: PatchWindow, detour: Detour,
            probes: tuple[int, ...], runs: int, seed: int,
            patches: tuple[tuple[int, bytes], ...] = (),
            entries: tuple[tuple[int, int], ...] = ()) -> str | None:
    rw = pair.rewritten
    why_table = _table_entries(window, detour, patches)
    if why_table is not None:
        return why_table
    sources = _patched_sources(image, window, patches)
    inside = tuple((a, b) for a, b in patches if window.start <= a < window.end)
    written: list[tuple[int, int]] = []
    try:
        for a, b in patches:
            rw.uc.mem_write(a, b)
            _drop_translations(rw, a, a + len(b))
            written.append((a, a + len(b)))
        extra = [(lo, hi) for lo, hi in written]
        runs_from: list[tuple[int, int, tuple[tuple[int, int], ...]]] = [
            (window.start, window.start, ())]
        runs_from += [(a, b, ()) for a, b in entries]
        runs_from += [(lo, lo, ((lo, hi),)) for lo, hi in sources]
        for orig, new, own in runs_from:
            why = _verify_one(pair, image, window, detour, probes, runs, seed, orig, new,
                              [*own, *extra], inside)
            if why is not None:
                where = "" if orig == window.start else (
                    f"entered at {orig:#x} (the detour's {new:#x}): " if orig != new else
                    f"entered at the way in {orig:#x}: ")
                return where + why
    finally:
        for lo, hi in written:
            rw.uc.mem_write(lo, image.read_vaddr(lo, hi - lo))
            _drop_translations(rw, lo, hi)
    return None


def _table_entries(window: PatchWindow, detour: Detour,
                   patches: tuple[tuple[int, bytes], ...]) -> str | None:
    """A retargeted jump-table entry must now name the detour's copy of its target (the copy
    itself is then run from, like the target, as an entry)."""
    mapping = dict(detour.insn_map)
    written = dict(patches)
    for r in window.retargets:
        if r.how not in ("table4", "table8"):
            continue
        raw = written.get(r.source)
        size = 4 if r.how == "table4" else 8
        if raw is None or len(raw) != size:
            return f"the jump-table entry at {r.source:#x} is not rewritten"
        value = (r.base + int.from_bytes(raw, "little", signed=True)) & (2**64 - 1) \
            if size == 4 else int.from_bytes(raw, "little")
        if value != mapping.get(r.target):
            return (f"the jump-table entry at {r.source:#x} names {value:#x}, not the "
                    f"detour's copy of {r.target:#x}")
    return None


def _patched_sources(image: ElfImage, window: PatchWindow,
                     patches: tuple[tuple[int, bytes], ...]) -> list[tuple[int, int]]:
    """The branch instructions holding each patch (a table entry or stub holds none)."""
    out: list[tuple[int, int]] = []
    for a, _b in patches:
        for r in window.retargets:
            if r.how in ("rel32", "rel8-stub") and r.source <= a < r.source + 8:
                raw = image.read_vaddr(r.source, 16)
                ins = sweep(bytes(raw), r.source).insns
                if ins and (r.source, ins[0].end) not in out:
                    out.append((r.source, ins[0].end))
    return out


def _verify_one(pair: _Pair, image: ElfImage, window: PatchWindow, detour: Detour,
                probes: tuple[int, ...], runs: int, seed: int, entry: int, new_entry: int,
                extra: list[tuple[int, int]],
                inside: tuple[tuple[int, bytes], ...] = ()) -> str | None:
    rw = pair.rewritten
    # the detour's bytes are mapped in both machines: a window that loads through a random
    # pointer into the new segment then reads the same bytes in both (otherwise the original
    # faults there and the rewrite does not, which says nothing about the detour). Its pages
    # are unmapped again at the end, so that no check sees an earlier detour's bytes.
    # A window re-laid where it is (analysis/relay.py) is a "detour" at the window's start
    # of the window's length: the rewritten machine holds its bytes in place of the window.
    relaid = detour.address == window.start
    lo = detour.address // PAGE * PAGE
    hi = (detour.end + PAGE - 1) // PAGE * PAGE
    fresh = [p for p in range(lo, hi, PAGE) if p not in rw.mapped]
    for box in (pair.original, rw) if not relaid else ():
        box._map(lo, hi - lo)
        box.uc.mem_write(detour.address, detour.code)
        for p_lo, p_hi in _runs(fresh):
            box.uc.mem_protect(p_lo, p_hi - p_lo, PROT_CODE)
    if relaid:
        fresh = []
        patch = detour.code
    else:
        patch = jmp_rel32(window.start, detour.address) if window.entry_stub is None else \
            jmp_rel8(window.start, window.entry_stub)  # a short window: through its stub
        patch += b"\xcc" * (window.size - len(patch))
        # a way in's stub in the window's own int3 filler (analysis/windows.py)
        for at, raw in inside:
            patch = patch[:at - window.start] + raw + patch[at - window.start + len(raw):]
    rw.uc.mem_write(window.start, patch)
    # unicorn keeps translated blocks across mem_write: without dropping them, a detour laid
    # at the address of an earlier (rejected) one, or the restored window, runs stale code
    _drop_translations(rw, window.start, window.end)
    _drop_translations(rw, detour.address, detour.end)
    mapping = dict(detour.insn_map)
    new_probes = {mapping[p] for p in probes}
    calls = set(window.calls)
    returns = {i.end: mapping[i.end] for i in window.insns
               if i.address in calls and i.end in mapping}
    # the rewritten machine's instructions in the original's addresses (the loop check)
    rw.coord = {n: o for o, n in detour.insn_map}
    rw.detour_lo, rw.detour_hi = detour.address, detour.end
    rw.patch_jmp = None if relaid else window.start
    rw.stubs = frozenset(a for a in (window.entry_stub, *(r.stub for r in window.retargets))
                         if a is not None)
    # a data read of the bytes the rewrite changes (a random pointer into the window or a
    # patched branch) reads different bytes in the two machines: the state is not judged
    changed = [(window.start, window.end), *extra]
    hooks = [(box, box.uc.hook_add(HOOK_MEM_READ, box._on_read, None, max(0, c_lo - 15),
                                   c_hi - 1))
             for box in (pair.original, rw) for c_lo, c_hi in changed]
    saved_avoid = pair.avoid
    pair.avoid = [*pair.avoid, (lo, hi)]
    # where each run may go (a set of addresses: tested at every instruction)
    a_allowed = _addresses([(window.start, window.end), *extra])
    b_allowed = a_allowed | _addresses([(detour.address, detour.end)])
    old_probes = set(probes)
    rng = random.Random(seed ^ entry)
    pool = rng.randbytes(STACK_POOL)
    done = attempts = 0
    try:
        while done < runs:
            attempts += 1
            if attempts > 4 * runs:
                return (f"only {done} of {runs} random states could be judged (the others "
                        f"read the bytes the rewrite changes)")
            state, stack = _draw_state(rng, pair, pool)
            s = rng.getrandbits(32)
            a, a_regs, a_mem = pair.original.execute(entry, state, stack, a_allowed,
                                                     old_probes, s)
            b, b_regs, b_mem = rw.execute(new_entry, state, stack, b_allowed, new_probes, s)
            if a.aliased or b.aliased:
                continue
            if a.fault is not None:
                # judged on what it shows: the same instruction faults the same way, after
                # the same probe hits and writes, with the same registers
                if b.fault is None:
                    return f"the original faults ({a.fault}) where the detour does not"
                why = _compare_faults(a, a_regs, a_mem, b, b_regs, b_mem)
            else:
                if returns:
                    b_mem = _returns_as_original(a_mem, b_mem, b_regs, returns)
                why = _compare(a, a_regs, a_mem, b, b_regs, b_mem)
            if why is not None:
                return f"state {done}: {why}"
            done += 1
    finally:
        for box, h in hooks:
            box.uc.hook_del(h)
        pair.avoid = saved_avoid
        rw.coord, rw.detour_lo, rw.detour_hi, rw.patch_jmp = {}, 0, 0, None
        rw.stubs = frozenset()
        # the next site starts from the original (all of [start, end): `code` stops short of
        # `end` when the window ends in the padding after a function)
        rw.uc.mem_write(window.start, image.read_vaddr(window.start, window.size))
        _drop_translations(rw, window.start, window.end)
        for box in (pair.original, rw):
            for page in fresh:
                if page in box.mapped:
                    box.uc.mem_unmap(page, PAGE)
                    box.mapped.discard(page)
            _drop_translations(box, lo, hi)
    return None


def _addresses(ranges: list[tuple[int, int]]) -> frozenset[int]:
    return frozenset(a for lo, hi in ranges for a in range(lo, hi))


def _compare_faults(a: _Run, a_regs: bytes, a_mem: dict[int, int], b: _Run,
                    b_regs: bytes, b_mem: dict[int, int]) -> str | None:
    """Both runs faulted: at the copy of the same instruction, the same way, with the same
    probe hits, registers and memory written before it."""
    if a.last != b.last:
        at = f"{b.last:#x}" if b.last is not None else "an instruction of its own"
        return f"the detour faults at the copy of {at}, the original at {a.last:#x}"
    if a.fault != b.fault:
        return f"the detour faults with {b.fault}, the original with {a.fault}"
    if len(a.hits) != len(b.hits):
        return f"reaches the probe {len(b.hits)} times before the fault instead of {len(a.hits)}"
    for i, (ha, hb) in enumerate(zip(a.hits, b.hits, strict=True)):
        if ha != hb:
            return f"registers at probe hit {i} differ: {_diff(ha, hb)}"
    if a_regs != b_regs:
        return f"registers at the fault differ: {_diff(a_regs, b_regs)}"
    if a_mem != b_mem:
        return "memory written before the fault differs"
    return None


def _returns_as_original(a_mem: dict[int, int], b_mem: dict[int, int],
                         b_regs: bytes, returns: dict[int, int]) -> dict[int, int]:
    """`b_mem` with a moved call's return address put back as the original's: when the
    rewritten run stopped at a callee's entry and the 8 bytes at its rsp hold the detour's
    copy of a return address where the original's hold that return address."""
    rsp = int.from_bytes(b_regs[_RSP_AT:_RSP_AT + 8], "little")
    if not all(a in b_mem and a in a_mem for a in range(rsp, rsp + 8)):
        return b_mem
    got = int.from_bytes(bytes(b_mem[a] for a in range(rsp, rsp + 8)), "little")
    want = int.from_bytes(bytes(a_mem[a] for a in range(rsp, rsp + 8)), "little")
    if returns.get(want) != got:
        return b_mem
    fixed = dict(b_mem)
    for k, byte in enumerate(want.to_bytes(8, "little")):
        fixed[rsp + k] = byte
    return fixed


def _drop_translations(box: _Sandbox, lo: int, hi: int) -> None:
    box.uc.ctl_remove_cache(lo // PAGE * PAGE, (hi + PAGE - 1) // PAGE * PAGE)


def _compare(a: _Run, a_regs: bytes, a_mem: dict[int, int], b: _Run,
             b_regs: bytes, b_mem: dict[int, int]) -> str | None:
    if b.fault is not None:
        return f"the detour faults ({b.fault}) where the original does not"
    if a.exit != b.exit:
        return f"leaves to {b.exit:#x} instead of {a.exit:#x}" if b.exit is not None and \
            a.exit is not None else "does not leave the same way"
    if len(a.hits) != len(b.hits):
        return f"reaches the probe {len(b.hits)} times instead of {len(a.hits)}"
    for i, (ha, hb) in enumerate(zip(a.hits, b.hits, strict=True)):
        if ha != hb:
            return f"registers at probe hit {i} differ: {_diff(ha, hb)}"
    if a_regs != b_regs:
        return f"registers at the exit differ: {_diff(a_regs, b_regs)}"
    if a_mem != b_mem:
        return "memory written differs"
    return None


def _diff(a: bytes, b: bytes) -> str:
    x, y = raw_regs(a), raw_regs(b)
    return ", ".join(f"{n} {x[n]:#x} != {y[n]:#x}" for n in REG_NAMES if x[n] != y[n])


# ---------------------------------------------------------------------------------------
# Verifying many detours at once, across processes (docs/performance.md, "Rewrite")
#
# The planner asks about one detour at a time and lays out the next one after the answer.
# `plan_verified` runs the planner with a verifier that answers from a memo and records
# what it cannot answer yet (answering "equivalent" for now); the recorded detours are
# verified in worker processes, all at once, and the planner runs again with the answers,
# until it asks nothing new or every new answer is "equivalent" (the answer that run was
# given for now: a run with the real answers would decide the same). The last run's answers
# were then all true, so its decisions are those a planner verifying one detour at a time
# would take. A detour that failed frees its place, and the detours after it move: an
# answer holds for the same window relocated to another address (the same instructions,
# branches and site bytes at the same offsets), so the memo is keyed by the detour's shape,
# not its address, and a moved detour is not run again. Results do not depend on which
# worker ran a detour: every check starts from the same machine state (`_verify_one` unmaps
# the detour's pages again), and a proof's answer depends on the question alone (a
# counterexample is asked in a z3 context of its own: usdtpatch.prove.smt.fresh_context).
# A worker that dies (the emulator crashing) stops the rewrite with an UnsupportedError
# instead of a hang.

JOBS_MIN_DETOURS = 24  # fewer detours: the pool's start-up costs more than it saves
PENDING = "pending"  # the memo's `last_method` for an answer not back yet

_Patches = tuple[tuple[int, bytes], ...]
_Entries = tuple[tuple[int, int], ...]
_Key = tuple[object, ...]
_Job = tuple[PatchWindow, Detour, tuple[int, ...], _Patches, _Entries]


def _shape(window: PatchWindow, detour: Detour, probes: tuple[int, ...], patches: _Patches,
           entries: _Entries) -> _Key:
    a = detour.address
    return (window.start, window.end, probes, len(detour.code),
            tuple((o, n - a) for o, n in detour.insn_map), detour.probe_address - a,
            tuple((at, len(b)) for at, b in patches), tuple((o, n - a) for o, n in entries))


class _Memo:
    """The planner's verifier during `plan_verified`: known answers from the memo; a detour
    not seen before is answered "equivalent" for now and sent to the workers (in chunks, so
    that they verify while the planner goes on). `last_method` is how the answer was
    reached (the workers' verifier's `last_method`: "proved" or "emulated"), PENDING for
    one not known yet; `method(detour)` gives it for a detour of the last run once settled."""

    CHUNK = 8

    def __init__(self, pool: Any, progress: Callable[[int, int], None] | None = None) -> None:
        self.pool = pool
        self.progress = progress  # (detours verified, detours asked) as answers come back
        self.answers: dict[_Key, tuple[str | None, str]] = {}
        self.asked: dict[_Key, _Job] = {}
        self.batch: list[_Key] = []
        self.sent: list[tuple[list[_Key], Any]] = []
        self.last_method = PENDING
        self.placed: dict[int, _Key] = {}  # detour address -> its question, in the last run

    def __call__(self, image: ElfImage, window: PatchWindow, detour: Detour,
                 probes: tuple[int, ...], *, patches: _Patches = (),
                 entries: _Entries = ()) -> str | None:
        key = _shape(window, detour, probes, patches, entries)
        self.placed[detour.address] = key  # a later detour at the address is the one kept
        if key in self.answers:
            why, self.last_method = self.answers[key]
            return why
        self.last_method = PENDING
        if key not in self.asked:
            self.asked[key] = (window, detour, probes, patches, entries)
            self.batch.append(key)
            if len(self.batch) >= self.CHUNK:
                self.send()
        return None

    def method(self, detour: Detour) -> str:
        """How the detour at `detour.address` in the last run was verified (settled)."""
        return self.answers[self.placed[detour.address]][1]

    def send(self) -> None:
        if self.batch:
            jobs = [self.asked[k] for k in self.batch]
            self.sent.append((self.batch, self.pool.submit(_worker_run, jobs)))
            self.batch = []

    def settle(self) -> bool:
        """Wait for every answer asked for; False when the planner's run stands: nothing was
        asked, or every answer is "equivalent", the answer it was given for now (a planner
        run again with the same answers takes the same decisions)."""
        self.send()
        if not self.sent:
            return False
        changed = False
        total = sum(len(keys) for keys, _ in self.sent)
        done = 0
        chunks = {pending: keys for keys, pending in self.sent}
        for pending in as_completed(chunks):  # counted as they come back
            keys = chunks[pending]
            for key, answer in zip(keys, pending.result(), strict=True):
                self.answers[key] = answer
                changed = changed or answer[0] is not None
            done += len(keys)
            if self.progress is not None:
                self.progress(done, total)
        self.sent.clear()
        self.asked.clear()
        return changed

    def rerun(self) -> None:
        self.placed.clear()


_WORKER: dict[str, tuple[ElfImage, Verifier]] = {}  # a worker process's own


def _worker_start(image: ElfImage, runs: int, seed: int, parent: int,
                  wrap: Callable[[Verifier], Verifier] | None) -> None:
    # a worker ends with its parent (killed or not: usdtpatch.lifetime); Ctrl-C is the
    # parent's: it stops the pool (a worker would print a traceback)
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.enable()  # forked from a rewrite that pauses it (cli/__init__.py): the workers' as before
    emulator = DetourVerifier(runs, seed)
    emulator._image, emulator._pair = image, _new_pair(image)  # ready before the first job
    _WORKER["state"] = (image, emulator if wrap is None else wrap(emulator))


def _worker_run(jobs: list[_Job]) -> list[tuple[str | None, str]]:
    image, verifier = _WORKER["state"]
    out = []
    for w, d, p, pa, e in jobs:
        why = verifier(image, w, d, p, patches=pa, entries=e)  # type: ignore[call-arg]
        out.append((why, getattr(verifier, "last_method", EMULATED)))
    return out


def plan_verified(image: ElfImage, plan: Callable[[Verifier], _T], *, jobs: int | None = None,
                  runs: int = RUNS, seed: int = 1, expected: int = 0,
                  wrap: Callable[[Verifier], Verifier] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> _T:
    """`plan(verifier)` with every detour it keeps verified, `jobs` worker processes (default:
    the CPUs this process may use) verifying in parallel. `expected` (the number of probes)
    decides whether a pool is worth starting; with one job, or in a daemonic process, the
    detours are verified here, one machine pair for all. Call it before the planner's own
    analysis: the workers are forked first, while this process is small.

    `wrap(emulator)`, when given, is the verifier each process uses instead of the emulator
    alone (the prover's, usdtpatch.prove.verifier: proofs first, the emulator for the rest).
    With workers, `plan` is given a memo whose `last_method` may be PENDING while a detour's
    answer is not back; its `method(detour)` says how each detour of the run `plan`
    returned from was verified. `progress(done, total)`: the detours the workers have
    verified of those asked, as their answers come back (none without workers: the planner's
    own progress covers a verification done as it plans)."""
    if jobs is None:
        affinity = getattr(os, "sched_getaffinity", None)
        n = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    else:
        n = jobs
    if n <= 1 or expected < JOBS_MIN_DETOURS or multiprocessing.current_process().daemon:
        emulator = DetourVerifier() if (runs, seed) == (RUNS, 1) else DetourVerifier(runs, seed)
        return plan(emulator if wrap is None else wrap(emulator))
    ctx = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_worker_start,
                               initargs=(image, runs, seed, os.getpid(), wrap))
    try:
        # the first job forks every worker: make one now, before the planner's analysis
        # grows this process (a forked worker's memory starts as a copy of it)
        pool.submit(int)
        memo = _Memo(pool, progress)
        while True:
            result = plan(memo)
            if not memo.settle():
                return result
            memo.rerun()
    except BrokenProcessPool as exc:  # a worker died (the emulator crashed): no hang
        raise UnsupportedError(
            "a process verifying detours in the emulator died; rewrite with --no-verify to "
            "skip the check, or report it with the file") from exc
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
