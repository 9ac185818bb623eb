"""The kernel's rules for a uprobe site: the one engine check, plan, verify and rewrite ask.

Pure: a kernel generation (a row of usdtpatch.kernelfacts.GENERATIONS), the bytes of the
probed instruction, its address, the process's bitness and a reachability test for the
trampoline in; a `Verdict` (outcome, reason, registered finding code) out. The facts
(docs/kernel.md, "Which sites each generation optimizes"; the codes in docs/findings.md, "The
kernel's verdict on a site"), each read from the generation's row:

- An instruction with a CS (2e) or DS (3e) prefix cannot be probed at all (perf_event_open
  fails with errno 524 for a process; a system-wide probe is silently lost, 0 hits), unless it
  is the very NOP the generation optimizes (the nop10 `66 2e 0f 1f 84 ..`).
- A 32-bit (compat) process never gets an optimized uprobe.
- Otherwise a uprobe is optimized when the instruction is ONE NOP of the generation's length
  that its decoder accepts (90 or 0F 1F /0, other prefixes allowed, starting with the row's
  head; a `0F 1F /1..7` hint NOP is single-stepped), the NOP does not cross a 4 KiB page
  (`x86.nops.crosses_page`: `vaddr % 4096 <= 4096 - length`) and a trampoline page is within
  rel32 reach of the end of the instruction.

Which instruction a tracer attaches to (pc, or pc + 1 for `90` + NOP under the consumers the
row names) is the caller's business: it passes the bytes and address of that instruction and
`at_next`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from usdtpatch.findings import (
    NO_TRAMPOLINE_REACH,
    SITE_CROSSES_PAGE,
    SITE_ELF32,
    SITE_HINT_NOP,
    SITE_SEGMENT_PREFIX,
    is_registered,
    lookup,
)
from usdtpatch.kernelfacts import DEFAULT, OPTIMIZING, PAGE, Generation, generation_of_nop
from usdtpatch.x86.nops import crosses_page, decode_nop

Reach = Callable[[int], bool]  # is a trampoline within rel32 reach of this call end?


class Outcome(Enum):
    OPTIMIZED = "optimized"  # a uprobe at the note's pc is optimized
    OPTIMIZED_AT_NEXT = "optimized-at-pc+1"  # only when attached at pc + 1 (libbpf)
    INT3 = "int3"  # probeable, stays on the int3 path
    UNPROBEABLE = "unprobeable"  # the kernel refuses to place a uprobe at pc
    NOT_APPLICABLE = "n/a"  # not x86-64 code, or the pc maps to no file bytes

    @property
    def optimized(self) -> bool:
        return self in (Outcome.OPTIMIZED, Outcome.OPTIMIZED_AT_NEXT)


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    reason: str
    code: str | None = None  # the registered finding code when something stands in the way

    def __post_init__(self) -> None:
        if self.code is not None:
            lookup(self.code)


def _always(_end: int) -> bool:
    return True


def not_optimized_code(gen: Generation) -> str:
    """The finding code of a site that is not the NOP `gen` optimizes (site-not-nop5, ...)."""
    return f"site-not-{gen.name}"


def at_next_code(gen: Generation) -> str | None:
    """The finding code of a `90` + NOP site optimized only at pc + 1 on `gen`, if any."""
    code = f"site-{gen.next_form}-pc1"
    return code if is_registered(code) else None


def unprobeable(code: bytes, gen: Generation = DEFAULT) -> Verdict | None:
    """The refusal when a kernel of `gen` cannot probe the instruction at code[0] at all."""
    nop = decode_nop(code[:15])
    if nop is not None and not gen.probeable(code, nop.prefixes):
        return Verdict(Outcome.UNPROBEABLE,
                       f"{nop.length}-byte NOP with a {'CS' if 0x2E in nop.prefixes else 'DS'} "
                       f"prefix: the kernel refuses to probe it (errno 524; a system-wide "
                       f"probe is silently lost)",
                       SITE_SEGMENT_PREFIX.code)
    return None


def _elf32() -> Verdict:
    return Verdict(Outcome.INT3, "32-bit (compat) processes are never optimized", SITE_ELF32.code)


def rule(gen: Generation, code: bytes, address: int, *, is64: bool = True,
         reach: Reach = _always, at_next: bool = False) -> Verdict:
    """What a kernel of generation `gen` does with a uprobe on the instruction at `address`
    (bytes `code`).

    `at_next`: the site is `90` + NOP and `code`/`address` are the NOP's, which is optimized
    only for a tracer attaching at pc + 1.
    """
    refused = unprobeable(code, gen)
    if refused is not None:
        return refused
    if not is64:
        return _elf32()
    if not gen.optimizes:
        return _optimizes_nothing(gen.name)
    nop = decode_nop(code[:15])
    pc = address - 1 if at_next else address
    if nop is None:
        return Verdict(Outcome.INT3, f"the instruction at {pc:#x} is not a NOP",
                       not_optimized_code(gen))
    if nop.hint and nop.length == gen.nop_length:
        return Verdict(Outcome.INT3, "0f 1f /r hint NOP with ModRM.reg != 0: single-stepped, "
                                     "not optimized", SITE_HINT_NOP.code)
    if not gen.accepts(code, nop.length, nop.hint):
        other = generation_of_nop(nop.length)
        return _not_this_nop(gen.name, nop.length, other.name if other is not None else "")
    n = gen.nop_length
    if crosses_page(address, n):
        return Verdict(Outcome.INT3, f"the nop{n} at {address:#x} crosses a 4 KiB page "
                                     f"(page offset {address % PAGE:#x} > {PAGE - n:#x})",
                       SITE_CROSSES_PAGE.code)
    if not reach(address + n):
        return Verdict(Outcome.INT3, "no page for the trampoline within +/-2 GiB",
                       NO_TRAMPOLINE_REACH.code)
    if at_next:
        return Verdict(Outcome.OPTIMIZED_AT_NEXT,
                       f"nop; nop{n}: optimized when attached at pc + 1 ({gen.next_consumer})",
                       at_next_code(gen))
    return Verdict(Outcome.OPTIMIZED, f"{n}-byte NOP within one page")


# The verdicts every 1-byte site gets, made once (each site kept its own reasons: ~350
# bytes of a site's check at 1,000,000 probes; docs/performance.md, "Scaling").
@lru_cache(maxsize=64)
def _not_this_nop(gen: str, length: int, optimized_by: str) -> Verdict:
    row = next(g for g in OPTIMIZING if g.name == gen)
    also = f" (the {optimized_by} generation's)" if optimized_by else ""
    return Verdict(Outcome.INT3, f"{length}-byte NOP{also}: the {gen} generation optimizes "
                   f"only {row.nop_length}-byte NOPs"
                   + (f" starting {row.nop_head.hex(' ')}" if row.nop_head else ""),
                   not_optimized_code(row))


@lru_cache(maxsize=8)
def _optimizes_nothing(gen: str) -> Verdict:
    return Verdict(Outcome.INT3, f"the {gen} generation optimizes no uprobe")


def optimized_where_it_is(code: bytes, address: int, gen: Generation = DEFAULT) -> bool:
    """True when a kernel of `gen` optimizes a uprobe on the instruction `code` at `address`
    in a 64-bit process, the trampoline aside: what a rewrite asks of a site it keeps or
    makes."""
    return rule(gen, code, address).outcome.optimized
