"""A counterexample of the prover (usdtpatch.prove) run in the emulator: the window and the
detour from one concrete initial state, and what differs between them (None: nothing).

The state is the solver's model: the general registers, the status flags, xmm0-15, and the
initial memory, every byte of which is the model's value (its default byte where it names
none), except the window's and the detour's own code. Each side runs from its entry until
control leaves its code (the window's start counts as leaving, as in the proof); the
rewritten side also gets the writes of a traced 6.18 hit at each optimized NOP when the model
says the probe is traced (the call's return address, rcx, r11, rax below rsp; the
trampoline's pops give the registers back). Compared: the exit, the registers, the flags,
every byte either side wrote outside the tracer's bytes below the guard, the probe hits and
their registers. A fault is judged as the emulator judges it (usdtpatch.verification.equivalence):
both sides must fault, at the same original instruction (the detour's last instruction that
copies one, by its instruction map), the same way, after the same probe hits, with the same
registers and the same bytes written before it. Pages are mapped as they are touched, so a
replay costs a few pages whatever the size of the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from usdtpatch.kernelfacts import PAGE
from usdtpatch.verification.machine import (
    GPR_NAMES,
    HOOK_CODE,
    HOOK_MEM_UNMAPPED,
    HOOK_MEM_WRITE,
    RegReader,
    RegWriter,
    UcError,
    new_x86_64,
)

MAX_INSNS = 1000
_STATUS_FLAGS = 0x8D5
TRAMPOLINE_BYTES = 32
TOO_MANY = "too many instructions"
LOW = 0x10000  # the lowest address a process can map (vm.mmap_min_addr's default)


@dataclass(frozen=True, slots=True)
class State:
    """A concrete initial state."""

    gprs: dict[str, int]
    xmm: tuple[int, ...]  # xmm0-15
    rflags: int
    memory: dict[int, int]  # address -> byte
    default_byte: int
    traced: bool


@dataclass(frozen=True, slots=True)
class Side:
    """One side's code and how it runs: [lo, hi) holds `code`; `probes` are where the tracer
    reads the registers; `tracer` the NOPs where a traced hit writes below rsp."""

    lo: int
    code: bytes
    entry: int
    probes: frozenset[int]
    tracer: frozenset[int] = frozenset()
    stops: frozenset[int] = frozenset()
    # (original instruction, its copy here): where a fault is counted (empty: the code is
    # the original, each instruction is itself)
    origin: tuple[tuple[int, int], ...] = ()

    @property
    def hi(self) -> int:
        return self.lo + len(self.code)


@dataclass
class _Run:
    exit: int | None = None
    fault: str | None = None
    last: int | None = None  # the original instruction last started (a fault's place)
    hits: list[tuple[int, ...]] = field(default_factory=list)
    probe_rsp: list[int] = field(default_factory=list)
    written: set[int] = field(default_factory=set)
    clobbered: set[int] = field(default_factory=set)  # written last by a traced hit
    steps: int = 0


def _run(side: Side, state: State, code_ranges: list[tuple[int, bytes]],
         link_pages: frozenset[int] = frozenset()) -> tuple[
        _Run, tuple[int, ...], Callable[[int], int]]:
    """One side run from `state`: the run, the registers at its end, and a reader of its
    memory's bytes (pages it never touched read as the initial state). An access below
    64 KiB faults (vm.mmap_min_addr; the prover's fault model) but in `link_pages`."""
    uc = new_x86_64()
    mapped: set[int] = set()

    # Memory is the model's, mapped a page at a time as the run touches it: a replay then
    # costs a few pages whatever the file's size, and every byte the run reads is the byte
    # the proof assumed (the code ranges laid over it, as they are in the process).
    def fill(page: int) -> None:
        data = bytearray([state.default_byte]) * PAGE
        for a in range(page, page + PAGE):
            v = state.memory.get(a)
            if v is not None:
                data[a - page] = v
        for lo, code in code_ranges:
            for a in range(max(lo, page), min(lo + len(code), page + PAGE)):
                data[a - page] = code[a - lo]
        uc.mem_map(page, PAGE)
        uc.mem_write(page, bytes(data))
        mapped.add(page)

    run = _Run()
    reader = RegReader(uc)
    copies = {new: orig for orig, new in side.origin} if side.origin else None

    def regs() -> tuple[int, ...]:
        r = reader.read()
        return (*(r[n] for n in GPR_NAMES), r["rflags"] & _STATUS_FLAGS,
                *(r[f"xmm{i}"] for i in range(16)))

    def on_unmapped(uc: Any, _access: int, address: int, _size: int, _value: int,
                    _user: Any) -> bool:
        page = address // PAGE * PAGE
        # the prover's fault model: non-canonical addresses and the pages below
        # vm.mmap_min_addr fault (the file's own low pages aside); anything else is mapped
        if page >= 1 << 47 or (page < LOW and page not in link_pages):
            return False
        for p in (page, page + PAGE):  # an access may straddle two pages
            if p not in mapped and p < 1 << 47 and (p >= LOW or p in link_pages):
                fill(p)
        return True

    # Bytes the program writes count in the comparison; bytes the tracer wrote (below) and
    # the program did not write again are "clobbered", compared by neither side.
    def on_write(uc: Any, _access: int, address: int, size: int, _value: int,
                 _user: Any) -> None:
        run.written.update(range(address, address + size))
        run.clobbered.difference_update(range(address, address + size))

    def on_code(uc: Any, address: int, _size: int, _user: Any) -> None:
        run.steps += 1
        # leaving the side's code ends the run, and so does coming back to a stop (the
        # window's start) after the first instruction: as in the proof, that is leaving
        if not side.lo <= address < side.hi or (run.steps > 1 and address in side.stops):
            run.exit = address
            uc.emu_stop()
            return
        if run.steps > MAX_INSNS:
            run.fault = TOO_MANY
            uc.emu_stop()
            return
        where = address if copies is None else copies.get(address)
        if where is not None:
            run.last = where
        if address in side.probes:
            run.hits.append(regs())
            run.probe_rsp.append(reader.read()["rsp"])
        if address in side.tracer and state.traced:
            # a traced 6.18 hit of an optimized NOP: the call pushes its return address and
            # the trampoline saves rcx, r11 and rax below it; its pops give the registers back,
            # so only the memory is written here
            r = reader.read()
            rsp = r["rsp"]
            for k, v in enumerate((address + 5, r["rcx"], r["r11"], r["rax"])):
                at = rsp - 8 * (k + 1)
                for p in (at // PAGE * PAGE, (at + 7) // PAGE * PAGE):
                    if p not in mapped:
                        fill(p)
                uc.mem_write(at, v.to_bytes(8, "little"))
                run.written.update(range(at, at + 8))
                run.clobbered.update(range(at, at + 8))

    uc.hook_add(HOOK_MEM_UNMAPPED, on_unmapped)
    uc.hook_add(HOOK_MEM_WRITE, on_write)
    uc.hook_add(HOOK_CODE, on_code)
    RegWriter(uc).write([state.gprs[n] for n in GPR_NAMES], state.rflags | 0x2,
                        list(state.xmm))
    for lo, code in code_ranges:
        for page in range(lo // PAGE * PAGE, lo + len(code), PAGE):
            if page not in mapped:
                fill(page)
    try:
        uc.emu_start(side.entry, 0, count=MAX_INSNS + 2)
    except UcError as exc:
        if run.exit is None:
            run.fault = str(exc)

    def peek(address: int) -> int:
        if address // PAGE * PAGE not in mapped:
            fill(address // PAGE * PAGE)
        return int(bytes(uc.mem_read(address, 1))[0])

    return run, regs(), peek


def replay(original: Side, rewritten: Side, state: State, *, dead_skip: int | None,
           returns: dict[int, tuple[int, ...]] | None = None,
           link_pages: frozenset[int] = frozenset()) -> str | None:
    """What differs between the two sides run from `state`, or None. `dead_skip`: a byte
    the traced hit wrote last is not compared when it lies in [rsp - skip - 32, rsp - skip)
    of the original's rsp at its probe (None: no tracer writes are modelled). `returns`: for
    a return address the original's call pushed, what the rewritten side may push instead
    (the detour's copy of it, where the moved call returns; the same address for an emulated
    call): when the original leaves through such a call, those 8 bytes are compared so.
    `link_pages`: pages below 64 KiB that are the file's own (link-time addresses the code's
    rip-relative operands name: a position-independent file runs above them); every other
    page there faults, as in a process and in the prover's model."""
    # both codes are mapped in each run, the side's own last: a window re-laid where it is
    # overlaps its original, and each side must run its own bytes there
    own = (original.lo, original.code), (rewritten.lo, rewritten.code)
    a, a_regs, a_peek = _run(original, state, [own[1], own[0]], link_pages)
    b, b_regs, b_peek = _run(rewritten, state, [own[0], own[1]], link_pages)
    if a.fault is not None or b.fault is not None:
        if a.fault is None or b.fault is None:
            return (f"the original faults ({a.fault})" if a.fault is not None else
                    f"the detour faults ({b.fault})") + " and the other does not"
        if a.fault == b.fault == TOO_MANY:
            return None  # neither run ended: nothing to judge
        # both fault: at the copy of the same instruction, the same way; the probe hits,
        # registers and bytes written before it are compared below as at an exit
        if a.last != b.last:
            at = f"{b.last:#x}" if b.last is not None else "an instruction of its own"
            return f"the detour faults at the copy of {at}, the original at {a.last or 0:#x}"
        if a.fault != b.fault:
            return f"the detour faults with {b.fault}, the original with {a.fault}"
    elif a.exit != b.exit:
        return f"leaves to {b.exit or 0:#x} instead of {a.exit or 0:#x}"
    if len(a.hits) != len(b.hits):
        return f"reaches the probe {len(b.hits)} times instead of {len(a.hits)}"
    names = [*GPR_NAMES, "rflags", *(f"xmm{i}" for i in range(16))]
    for i, (ha, hb) in enumerate(zip(a.hits, b.hits, strict=True)):
        if ha != hb:
            return f"registers at probe hit {i} differ: {_diff(names, ha, hb)}"
    slot: set[int] = set()
    rsp = a_regs[GPR_NAMES.index("rsp")]
    if returns and rsp == b_regs[GPR_NAMES.index("rsp")]:
        pushed = int.from_bytes(bytes(a_peek(rsp + k) for k in range(8)), "little")
        if pushed in returns and rsp in a.written:
            got = int.from_bytes(bytes(b_peek(rsp + k) for k in range(8)), "little")
            if got not in returns[pushed]:
                return (f"the call pushes {got:#x}: its callee returns there, not to "
                        + " or ".join(f"{v:#x}" for v in returns[pushed]))
            slot = set(range(rsp, rsp + 8))
    if a_regs != b_regs:
        return f"registers at the exit differ: {_diff(names, a_regs, b_regs)}"
    dead: set[int] = set()  # bytes the traced hit wrote last, where nothing reads them
    if dead_skip is not None:
        for rsp in a.probe_rsp:
            dead.update(range(rsp - dead_skip - TRAMPOLINE_BYTES, rsp - dead_skip))
        dead &= b.clobbered
    for addr in sorted((a.written | b.written) - dead - slot):
        x, y = a_peek(addr), b_peek(addr)
        if x != y:
            return f"the byte at {addr:#x} is {y:#04x} instead of {x:#04x}"
    return None


def _diff(names: list[str], a: tuple[int, ...], b: tuple[int, ...]) -> str:
    return ", ".join(f"{n} {x:#x} != {y:#x}" for n, x, y in zip(names, a, b, strict=True)
                     if x != y)
