"""Equivalence of a relocated window and its detour, checked by running both in unicorn.

For each of many random initial states (registers, flags, stack and every page the code
touches filled with seeded pseudo-random bytes), the original window runs from its first
instruction until control leaves it, and the rewritten code runs from the same address (the
`jmp` to the detour) until control leaves the window and the detour. Both must leave to the
same address with the same general registers, flags and vector registers, the same memory
written, and must reach the probe the same number of times with the same registers there (so a
tracer reads the same argument values). A state in which the original faults must fault in the
rewrite too; it is not counted.

Reference: usdt-and-rewriting.md ("Patch window"); the issue's rule: "the same exit address,
the same registers and flags, the same memory writes, and the probe reached exactly when the
original nop was reached, with the same registers there". The rewritten code's guard, when
present, lowers rsp by 128 around the NOP: registers are compared at the site's first byte,
before the guard.
"""

from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass, field
from typing import Any

import unicorn as _unicorn
from unicorn import UC_ARCH_X86, UC_HOOK_CODE, UC_HOOK_MEM_UNMAPPED, UC_HOOK_MEM_WRITE, UC_MODE_64
from unicorn import x86_const as X

from usdtpatch.elf.image import PT_LOAD, ElfImage
from usdtpatch.emulate.machine import GPR_NAMES, RegReader, RegWriter
from usdtpatch.sites.windows import PatchWindow
from usdtpatch.x86.relocate import Detour, jmp_rel32

_UC: Any = _unicorn
PAGE = 4096
RUNS = 64
MAX_INSNS = 2000
STACK_TOP = 0x7FFF_F000_0000
STACK_SIZE = 0x20000
_GPRS = GPR_NAMES
_XMM_COUNT = 16
_STATUS_FLAGS = 0x8D5  # CF PF AF ZF SF OF


def _pattern(page: int, seed: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < PAGE:
        out += hashlib.blake2b(struct.pack("<QQQ", page, seed, counter), digest_size=64).digest()
        counter += 1
    return bytes(out[:PAGE])


@dataclass
class _Run:
    exit: int | None = None
    fault: str | None = None
    hits: list[tuple[int, ...]] = field(default_factory=list)
    writes: set[int] = field(default_factory=set)
    steps: int = 0


class _Sandbox:
    """One unicorn machine holding a file's loadable segments (at link-time addresses)."""

    def __init__(self, image: ElfImage) -> None:
        self.uc: Any = _UC.Uc(UC_ARCH_X86, UC_MODE_64)
        self.mapped: set[int] = set()
        self.seed = 0
        self.lazy: set[int] = set()
        for seg in image.segments:
            if seg.type != PT_LOAD or not seg.memsz:
                continue
            lo = seg.vaddr // PAGE * PAGE
            hi = (seg.vaddr + seg.memsz + PAGE - 1) // PAGE * PAGE
            self._map(lo, hi - lo)
            data = image.data[seg.offset : seg.offset + seg.filesz]
            self.uc.mem_write(seg.vaddr, data)
        self._map(STACK_TOP - STACK_SIZE, STACK_SIZE)
        self.reader = RegReader(self.uc)  # one batch call instead of 33 reg_reads
        self.writer = RegWriter(self.uc)
        self.run: _Run = _Run()
        self.allowed: list[tuple[int, int]] = []
        self.probes: set[int] = set()
        self.saved: dict[int, int] = {}
        self.uc.hook_add(UC_HOOK_MEM_UNMAPPED, self._on_unmapped)
        self.uc.hook_add(UC_HOOK_MEM_WRITE, self._on_write)
        self.uc.hook_add(UC_HOOK_CODE, self._on_code)

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
        if _access == _UC.UC_MEM_FETCH_UNMAPPED:
            # control left for an unmapped (or non-canonical: unicorn passes a truncated
            # address, rip has the whole one) address, e.g. a `ret` of the window popping a
            # random return address: that is the window's exit, not a fault of the window
            rip = uc.reg_read(X.UC_X86_REG_RIP)
            if not any(lo <= rip < hi for lo, hi in self.allowed):
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
        if not any(lo <= address < hi for lo, hi in self.allowed):
            run.exit = address
            uc.emu_stop()
            return
        if run.steps > MAX_INSNS:
            run.fault = "too many instructions (the window loops)"
            uc.emu_stop()
            return
        if address in self.probes:
            run.hits.append(self.regs())

    def regs(self) -> tuple[int, ...]:
        """GPRs, status flags, xmm0-15 (not rip: it differs between window and detour)."""
        r = self.reader.read()
        return (*(r[n] for n in _GPRS), r["rflags"] & _STATUS_FLAGS,
                *(r[f"xmm{i}"] for i in range(16)))

    def execute(self, entry: int, regs: list[int], xmm: list[int], flags: int,
                stack: bytes, allowed: list[tuple[int, int]], probes: set[int],
                seed: int) -> tuple[_Run, tuple[int, ...], dict[int, int]]:
        self.seed = seed
        self.uc.mem_write(STACK_TOP - len(stack), stack)
        self.writer.write(regs, flags | 0x2, xmm)
        self.run = _Run()
        self.allowed = allowed
        self.probes = probes
        self.saved = {}
        try:
            self.uc.emu_start(entry, 0, count=MAX_INSNS + 2)
        except _UC.UcError as exc:
            if self.run.exit is None:  # else: left through an unmapped fetch (an exit)
                self.run.fault = str(exc)
        final = self.regs()
        memory = {a: self.uc.mem_read(a, 1)[0] for a in self.run.writes}
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
    segments: list[tuple[int, int]] = field(default_factory=list)  # loaded [lo, hi)


def _value(rng: random.Random, segments: list[tuple[int, int]]) -> int:
    """A random register value: any 64 bits, a stack or segment address, or a small int."""
    kind = rng.randrange(4)
    if kind == 1:
        return STACK_TOP - STACK_SIZE + 0x1000 + rng.randrange(STACK_SIZE - 0x2000)
    if kind == 2 and segments:
        lo, hi = rng.choice(segments)
        return lo + rng.randrange(max(1, hi - lo))
    if kind == 3:
        return rng.getrandbits(rng.choice((8, 16, 32)))
    return rng.getrandbits(64)


_CACHE: dict[int, tuple[ElfImage, _Pair]] = {}


def _pair(image: ElfImage) -> _Pair:
    key = id(image)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is image:
        return hit[1]
    _CACHE.clear()
    pair = _Pair(_Sandbox(image), _Sandbox(image),
                 [(seg.vaddr, seg.vaddr + seg.memsz) for seg in image.segments
                  if seg.type == PT_LOAD and seg.memsz])
    _CACHE[key] = (image, pair)
    return pair


def verify_detour(image: ElfImage, window: PatchWindow, detour: Detour,
                  probes: tuple[int, ...], runs: int = RUNS, seed: int = 1) -> str | None:
    """None when the detour behaves like the window in `runs` random states, else why not."""
    pair = _pair(image)
    rw = pair.rewritten
    # the detour's bytes are mapped in both machines: a window that loads through a random
    # pointer into the new segment then reads the same bytes in both (otherwise the original
    # faults there and the rewrite does not, which says nothing about the detour)
    for box in (pair.original, rw):
        box._map(detour.address // PAGE * PAGE,
                 (detour.end + PAGE - 1) // PAGE * PAGE - detour.address // PAGE * PAGE)
        box.uc.mem_write(detour.address, detour.code)
    patch = jmp_rel32(window.start, detour.address)
    patch += b"\xcc" * (window.size - len(patch))
    rw.uc.mem_write(window.start, patch)
    # unicorn keeps translated blocks across mem_write: without dropping them, a detour laid
    # at the address of an earlier (rejected) one, or the restored window, runs stale code
    _drop_translations(rw, window.start, window.end)
    _drop_translations(rw, detour.address, detour.end)
    mapping = dict(detour.insn_map)
    new_probes = {mapping[p] for p in probes}
    rng = random.Random(seed ^ window.start)
    done = attempts = 0
    try:
        while done < runs:
            attempts += 1
            if attempts > 4 * runs:
                return (f"only {done} of {runs} random states ran the original window to its "
                        f"end without a fault")
            # a fully random register is almost never a mappable address, so a window that
            # loads through one would fault in nearly every state: mix in pointers into the
            # stack and the file's segments, and small values
            regs = [_value(rng, pair.segments) for _ in _GPRS]
            rsp = STACK_TOP - 0x4000 - 8 * rng.randrange(256)
            regs[_GPRS.index("rsp")] = rsp
            xmm = [rng.getrandbits(128) for _ in range(_XMM_COUNT)]
            flags = rng.getrandbits(12) & _STATUS_FLAGS
            stack = rng.randbytes(0x8000)
            s = rng.getrandbits(32)
            a, a_regs, a_mem = pair.original.execute(
                window.start, regs, xmm, flags, stack, [(window.start, window.end)],
                set(probes), s)
            b, b_regs, b_mem = rw.execute(
                window.start, regs, xmm, flags, stack,
                [(window.start, window.end), (detour.address, detour.end)], new_probes, s)
            if a.fault is not None:
                if b.fault is None:
                    return f"the original faults ({a.fault}) where the detour does not"
                continue
            why = _compare(a, a_regs, a_mem, b, b_regs, b_mem)
            if why is not None:
                return f"state {done}: {why}"
            done += 1
    finally:
        # the next site starts from the original (all of [start, end): `code` stops short of
        # `end` when the window ends in the padding after a function)
        rw.uc.mem_write(window.start, image.read_vaddr(window.start, window.size))
        _drop_translations(rw, window.start, window.end)
    return None


def _drop_translations(box: _Sandbox, lo: int, hi: int) -> None:
    box.uc.ctl_remove_cache(lo // PAGE * PAGE, (hi + PAGE - 1) // PAGE * PAGE)


def _compare(a: _Run, a_regs: tuple[int, ...], a_mem: dict[int, int], b: _Run,
             b_regs: tuple[int, ...], b_mem: dict[int, int]) -> str | None:
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


def _diff(a: tuple[int, ...], b: tuple[int, ...]) -> str:
    names = [*_GPRS, "rflags", *(f"xmm{i}" for i in range(16))]
    return ", ".join(f"{n} {x:#x} != {y:#x}" for n, x, y in zip(names, a, b, strict=True)
                     if x != y)
