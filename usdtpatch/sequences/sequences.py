"""The kernel's write sequences for one uprobe site, as data, for every kernel generation.

Reference: the kernel's `int3_update` / `set_swbp` / `set_orig_insn` write protocol
(arch/x86/kernel/uprobes.c) as measured and described in docs/plan-verify.md. Its shape is the
same on every generation that optimizes (the row of usdtpatch.kernelfacts says what differs:
the optimized bytes, and how many bytes unoptimize writes back):

- attach:     byte 0 := cc                               (int3; the kernel checks byte 0 is
                                                          the original opcode)
- optimize:   byte 0 := cc, bytes 1..n-1 := the optimized bytes' (nop5: the rel32; nop10: the
              lea's tail and `e8 rel32`), byte 0 := the optimized byte 0 (e8, or 48)
              (before each write the kernel re-reads the site and checks byte 0: the original
              opcode, then cc, then cc; after each write it serializes every CPU)
- unoptimize: byte 0 := cc (expects the optimized byte 0), bytes 1..restored := original
              (expects cc), byte 0 := original (expects cc): on nop10 bytes 5..9 keep
              `e8 rel32`, which decode as the SIB and disp32 of the same NOP
- detach:     byte 0 := original (expects cc)

rel32 = trampoline - (site + n). Whether a site is a candidate at all is decided by the rule
engine (usdtpatch.analysis.rules), the same one `check` asks; the refusals here only word its
verdict for a plan. Everything here is pure: bytes and ints in, frozen dataclasses out.
"""

from __future__ import annotations

from dataclasses import dataclass

from usdtpatch.analysis.rules import Reach, Verdict, not_optimized_code, rule, unprobeable
from usdtpatch.findings import (
    NO_TRAMPOLINE_REACH,
    SITE_CROSSES_PAGE,
    SITE_ELF32,
    SITE_HINT_NOP,
    SITE_SEGMENT_PREFIX,
    Finding,
    lookup,
)
from usdtpatch.kernelfacts import CALL_REL32, GENERATIONS, INT3, OPTIMIZING, PAGE, Generation
from usdtpatch.x86.nops import decode_nop

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

PROTOCOL_INT3 = "int3"  # attach/detach only: the site stays on the int3 path
__all__ = ["CALL_REL32", "INT3"]  # the kernel's two opcodes, for the modules that read states


def protocol_generation(protocol: str) -> Generation | None:
    """The generation whose write protocol `protocol` names (a plan's protocol is the
    generation's name; `none`'s is attach and detach alone); None for int3 or a name no
    generation has."""
    return next((g for g in GENERATIONS if g.name == protocol), None)


@dataclass(frozen=True, slots=True)
class Step:
    """One write of the kernel to a site.

    `offset` is the first byte written, relative to the site; `data` the bytes written;
    `before`/`after` the whole site before and after the write; `expect_byte0` the value the
    kernel requires at byte 0 when it re-reads the site before writing (None: no check);
    `serialize` that every CPU is serialized after the write (smp_text_poke_sync_each_cpu).
    """

    offset: int
    data: bytes
    before: bytes
    after: bytes
    expect_byte0: int | None
    serialize: bool = True
    what: str = ""


@dataclass(frozen=True, slots=True)
class Sequence:
    """An ordered list of writes to the site at `address`, taking it from `start` to `end`."""

    name: str  # attach | optimize | unoptimize | detach
    address: int  # run-time address of byte 0
    start: bytes
    steps: tuple[Step, ...]

    @property
    def end(self) -> bytes:
        return self.steps[-1].after if self.steps else self.start

    @property
    def states(self) -> tuple[bytes, ...]:
        """The site's bytes before the first write and after each write."""
        return (self.start, *(s.after for s in self.steps))


def apply_write(state: bytes, offset: int, data: bytes) -> bytes:
    """`state` with `data` written at `offset` (the write must stay inside the site)."""
    if offset < 0 or offset + len(data) > len(state):
        raise ValueError(f"write of {len(data)} bytes at +{offset} leaves the "
                         f"{len(state)}-byte site")
    return state[:offset] + data + state[offset + len(data):]


def build_sequence(name: str, address: int, start: bytes,
                   writes: list[tuple[int, bytes, int | None, str]]) -> Sequence:
    """A Sequence from (offset, data, expect_byte0, what) writes applied in order to `start`."""
    steps: list[Step] = []
    state = start
    for offset, data, expect, what in writes:
        after = apply_write(state, offset, data)
        steps.append(Step(offset=offset, data=data, before=state, after=after, expect_byte0=expect,
                          serialize=True, what=what))
        state = after
    return Sequence(name, address, start, tuple(steps))


def rel32_for(site: int, length: int, target: int) -> int | None:
    """The displacement of a `call` ending at site + length to `target`, None when > +/-2 GiB.

    The call ends at the end of the generation's NOP (`Generation.call_offset` is where it
    starts: 0 on nop5, 5 on nop10).
    """
    rel = target - (site + length)
    return rel if INT32_MIN <= rel <= INT32_MAX else None


def call_target(site: int, call_end: int, rel32_bytes: bytes) -> int:
    """Where a `call rel32` whose last byte ends at `call_end` goes."""
    return site + call_end + int.from_bytes(rel32_bytes, "little", signed=True)


@dataclass(frozen=True, slots=True)
class SiteSequences:
    """Everything the kernel writes to one site under one protocol.

    `protocol` is the name of the generation whose sequences these are (nop5, nop10) or int3
    (the site cannot be optimized: only attach/detach). `optimize`/`unoptimize` are None for
    int3.
    """

    protocol: str
    address: int  # run-time address of byte 0 of the probed instruction
    original: bytes  # the instruction's bytes in the file
    trampoline: int | None
    attach: Sequence
    detach: Sequence
    optimize: Sequence | None
    unoptimize: Sequence | None

    @property
    def length(self) -> int:
        return len(self.original)

    @property
    def generation(self) -> Generation | None:
        return protocol_generation(self.protocol)

    @property
    def optimized(self) -> bytes | None:
        return None if self.optimize is None else self.optimize.end

    def all_sequences(self) -> tuple[Sequence, ...]:
        seqs = [self.attach, self.detach]
        if self.optimize is not None and self.unoptimize is not None:
            seqs += [self.optimize, self.unoptimize]
        return tuple(seqs)


def int3_sequences(address: int, original: bytes) -> SiteSequences:
    """The plain int3 attach/detach of a site the kernel does not optimize."""
    attach = build_sequence("attach", address, original,
                            [(0, bytes([INT3]), original[0], "int3 at byte 0")])
    detach = build_sequence("detach", address, attach.end,
                            [(0, original[:1], INT3, "restore byte 0")])
    return SiteSequences(protocol=PROTOCOL_INT3, address=address, original=original,
                         trampoline=None, attach=attach, detach=detach, optimize=None,
                         unoptimize=None)


def optimized_sequences(gen: Generation, address: int, original: bytes,
                        trampoline: int) -> SiteSequences:
    """The sequences of generation `gen` for its NOP at `address` calling `trampoline` (checked
    by the caller: see `refusal`)."""
    n = gen.nop_length
    rel = rel32_for(address, n, trampoline)
    if rel is None:
        raise ValueError(f"trampoline {trampoline:#x} is out of rel32 reach of {address:#x}")
    target = gen.optimized(rel)
    attach = build_sequence("attach", address, original,
                            [(0, bytes([INT3]), original[0], "int3 at byte 0")])
    detach = build_sequence("detach", address, attach.end,
                            [(0, original[:1], INT3, "restore byte 0")])
    # the words of each step, as the shipped protocol files have them (protocols/*.toml)
    head = gen.call_offset > 0  # the optimized bytes begin with a lea before the call
    optimize = build_sequence("optimize", address, original, [
        (0, bytes([INT3]), original[0], "int3 at byte 0 (attach)"),
        (1, target[1:], INT3, f"lea tail and call rel32 in bytes 1..{n - 1}" if head
         else f"rel32 in bytes 1..{n - 1}"),
        (0, target[:1], INT3, f"REX.W {target[0]:02x} at byte 0" if head
         else f"call opcode {target[0]:02x} at byte 0"),
    ])
    kept = " (e8 rel32 stays as SIB/disp32)" if gen.restored + 1 < n else ""
    unoptimize = build_sequence("unoptimize", address, optimize.end, [
        (0, bytes([INT3]), target[0], "int3 over byte 0" if head
         else "int3 over the call opcode"),
        (1, original[1:gen.restored + 1], INT3, f"restore bytes 1..{gen.restored}{kept}"),
        (0, original[:1], INT3, "restore byte 0"),
    ])
    return SiteSequences(protocol=gen.name, address=address, original=original,
                         trampoline=trampoline, attach=attach, detach=detach, optimize=optimize,
                         unoptimize=unoptimize)


def trampoline_reach(address: int, length: int, trampoline: int | None) -> Reach:
    def reach(_end: int) -> bool:
        return trampoline is not None and rel32_for(address, length, trampoline) is not None
    return reach


def refusal_finding(verdict: Verdict, address: int, length: int, original: bytes,
                    trampoline: int | None, where: str) -> Finding | None:
    """The plan's finding for a verdict of the rule engine (None when the site is optimized).

    The verdict (and so the code) comes from usdtpatch.analysis.rules; the wording is the plan's,
    in terms of the site's bytes and the trampoline it was given.
    """
    if verdict.outcome.optimized or verdict.code is None:
        return None
    code = lookup(verdict.code)
    if code is SITE_SEGMENT_PREFIX:
        insn = decode_nop(original[:15])
        n = insn.length if insn is not None else len(original)
        return code.finding(f"the probe instruction {original[:n].hex(' ')} has a CS/DS "
                            f"segment prefix: perf_event_open refuses it (errno 524)", where)
    if code is SITE_ELF32:
        return code.finding("32-bit (compat) processes are never optimized", where)
    for gen in OPTIMIZING:
        if code.code == not_optimized_code(gen):
            n = gen.nop_length
            return code.finding(f"the probe instruction {original[:n].hex(' ')} is not the "
                                f"{n}-byte NOP the {gen.name} generation optimizes", where)
    if code is SITE_HINT_NOP:
        return code.finding(f"the probe instruction {original[:5].hex(' ')} is a hint NOP "
                            f"(0f 1f /r with ModRM.reg != 0): the kernel single-steps it", where)
    if code is SITE_CROSSES_PAGE:
        return code.finding(f"the nop{length} at {address:#x} crosses a page boundary "
                            f"({address % PAGE:#x} > {PAGE - length:#x} into its page): the kernel "
                            "never optimizes it", where)
    if code is NO_TRAMPOLINE_REACH:
        if trampoline is None:
            return code.finding(f"no free page within +/-2 GiB of {address + length:#x} for "
                                f"the trampoline", where)
        return code.finding(f"trampoline {trampoline:#x} is more than +/-2 GiB from "
                            f"{address + length:#x}", where)
    return code.finding(verdict.reason, where)


def probeable_refusal(original: bytes, where: str) -> Finding | None:
    """A finding when the kernel refuses to probe the instruction at all (CS/DS prefix)."""
    v = unprobeable(original)
    return None if v is None else refusal_finding(v, 0, len(original), original, None, where)


def refusal(gen: Generation, address: int, original: bytes, trampoline: int | None,
            is64: bool, where: str) -> Finding | None:
    """Why a kernel of `gen` would not optimize this site, as a finding; None when it would."""
    n = gen.nop_length
    v = rule(gen, original, address, is64=is64, reach=trampoline_reach(address, n, trampoline))
    return refusal_finding(v, address, n, original, trampoline, where)
