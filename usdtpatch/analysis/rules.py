"""The kernel's rules for a uprobe site: the one engine check, plan, verify and rewrite ask.

Pure: the bytes of the probed instruction, its address, the process's bitness and a
reachability test for the trampoline in; a `Verdict` (outcome, reason, registered finding
code) out. The facts (docs/kernel.md, "Which sites 6.18 optimizes" and "The nop10 series"; the
codes in docs/findings.md, "The kernel's verdict on a site"):

- 6.18: an instruction with a CS (2e) or DS (3e) prefix cannot be probed at all
  (perf_event_open fails with errno 524), whatever the process. A 32-bit (compat) process never
  gets an optimized uprobe. Otherwise a uprobe is optimized when the instruction is ONE 5-byte
  instruction the kernel's decoder calls a NOP (90 or 0F 1F /0, other prefixes allowed; a
  `0F 1F /1..7` hint NOP is single-stepped), the 5 bytes do not cross a 4 KiB page
  (`x86.nops.crosses_page`: `vaddr % 4096 <= 4091`) and a trampoline page is within rel32
  reach of the end of the instruction.
- EXPERIMENTAL, the nop10 series (queued upstream in July 2026, in no release we can test):
  the 10-byte NOP `66 2e 0f 1f 84 <SIB> <disp32>` is optimized under the same page (assumed)
  and reach rules; a nop5 no longer is. Kept apart in `rule_nop10`.

Which instruction a tracer attaches to (pc, or pc + 1 for `nop; nop5` under libbpf 1.7) is the
caller's business: it passes the bytes and address of that instruction and `at_next`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import cache, lru_cache

from usdtpatch.findings import (
    NO_TRAMPOLINE_REACH,
    SITE_COMBO5_PC1,
    SITE_CROSSES_PAGE,
    SITE_ELF32,
    SITE_HINT_NOP,
    SITE_NOT_NOP5,
    SITE_NOT_NOP10,
    SITE_SEGMENT_PREFIX,
    lookup,
)
from usdtpatch.kernelfacts import PAGE
from usdtpatch.x86.nops import (
    NOP10_PREFIX,
    SEGMENT_PREFIXES_UNPROBEABLE,
    crosses_page,
    decode_nop,
)

NOP5_LENGTH = 5
NOP10_LENGTH = 10
EXPERIMENTAL_NOP10 = True  # rule_nop10 models an unreleased kernel series

Reach = Callable[[int], bool]  # is a trampoline within rel32 reach of this call end?


class Outcome(Enum):
    OPTIMIZED = "optimized"  # a uprobe at the note's pc is optimized
    OPTIMIZED_AT_NEXT = "optimized-at-pc+1"  # only when attached at pc + 1 (libbpf 1.7)
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


def unprobeable(code: bytes) -> Verdict | None:
    """The refusal when the kernel cannot probe the instruction at code[0] at all."""
    nop = decode_nop(code[:15])
    if nop is not None and set(nop.prefixes) & SEGMENT_PREFIXES_UNPROBEABLE:
        return Verdict(Outcome.UNPROBEABLE,
                       f"{nop.length}-byte NOP with a {'CS' if 0x2E in nop.prefixes else 'DS'} "
                       "prefix: the kernel refuses to probe it (errno 524)",
                       SITE_SEGMENT_PREFIX.code)
    return None


def _elf32() -> Verdict:
    return Verdict(Outcome.INT3, "32-bit (compat) processes are never optimized", SITE_ELF32.code)


def rule_618(code: bytes, address: int, *, is64: bool = True, reach: Reach = _always,
             at_next: bool = False) -> Verdict:
    """What a 6.18 kernel does with a uprobe on the instruction at `address` (bytes `code`).

    `at_next`: the site is `nop; nop5` and `code`/`address` are the nop5's, which is optimized
    only for a tracer attaching at pc + 1.
    """
    refused = unprobeable(code)
    if refused is not None:
        return refused
    if not is64:
        return _elf32()
    nop = decode_nop(code[:15])
    pc = address - 1 if at_next else address
    if nop is None:
        return Verdict(Outcome.INT3, f"the instruction at {pc:#x} is not a NOP",
                       SITE_NOT_NOP5.code)
    if nop.hint:
        return Verdict(Outcome.INT3, "0f 1f /r hint NOP with ModRM.reg != 0: single-stepped, "
                                     "not optimized", SITE_HINT_NOP.code)
    if nop.length != NOP5_LENGTH:
        return _not_nop5(nop.length)
    if crosses_page(address, NOP5_LENGTH):
        return Verdict(Outcome.INT3, f"the nop5 at {address:#x} crosses a 4 KiB page "
                                     f"(page offset {address % PAGE:#x} > 0xffb)",
                       SITE_CROSSES_PAGE.code)
    if not reach(address + NOP5_LENGTH):
        return Verdict(Outcome.INT3, "no page for the trampoline within +/-2 GiB",
                       NO_TRAMPOLINE_REACH.code)
    if at_next:
        return Verdict(Outcome.OPTIMIZED_AT_NEXT,
                       "nop; nop5: optimized when attached at pc + 1 (libbpf 1.7 does; bcc, "
                       "bpftrace 0.17, perf and gdb attach at pc, the 1-byte nop)",
                       SITE_COMBO5_PC1.code)
    return Verdict(Outcome.OPTIMIZED, "5-byte NOP within one page")


def is_nop10(code: bytes) -> bool:
    """True when code[0:10] is the 10-byte NOP form the queued series optimizes."""
    return len(code) >= NOP10_LENGTH and code.startswith(NOP10_PREFIX)


def rule_nop10(code: bytes, address: int, *, is64: bool = True, reach: Reach = _always,
               at_next: bool = False, v618: Verdict | None = None) -> Verdict:
    """EXPERIMENTAL: what a kernel with the queued nop10 series does with the instruction at
    `address` (the page rule for a nop10 is assumed to be the 6.18 one: 10 bytes in a page).

    For a site that is not a nop10 the verdict follows from the 6.18 one (`v618`, computed
    from `code` and `address` when not given: pass it when a tracer attaches elsewhere on
    6.18, as for `nop; nop5`)."""
    if is_nop10(code):
        if not is64:
            return _elf32()
        if crosses_page(address, NOP10_LENGTH):
            return Verdict(Outcome.INT3, f"the nop10 at {address:#x} crosses a 4 KiB page "
                                         "(assumed rule of the unreleased series)",
                           SITE_CROSSES_PAGE.code)
        if not reach(address + NOP10_LENGTH):
            return Verdict(Outcome.INT3, "no page for the trampoline within +/-2 GiB",
                           NO_TRAMPOLINE_REACH.code)
        if at_next:
            return Verdict(Outcome.OPTIMIZED_AT_NEXT,
                           "nop; nop10: optimized when attached at pc + 1 (unreleased series)")
        return Verdict(Outcome.OPTIMIZED, "10-byte NOP 66 2e 0f 1f 84 (unreleased series)")
    if v618 is None:
        v618 = rule_618(code, address, is64=is64, reach=reach, at_next=at_next)
    if v618.outcome is Outcome.UNPROBEABLE or v618.code == SITE_ELF32.code:
        return v618
    if v618.outcome.optimized:
        return Verdict(Outcome.INT3, "nop5 sites are no longer optimized by the nop10 series",
                       SITE_NOT_NOP10.code)
    return _not_nop10(v618.reason)


# The verdicts every 1-byte site gets, made once (each site kept its own two reasons: ~350
# bytes of a site's check at 1,000,000 probes; docs/performance.md, "Scaling").
@cache
def _not_nop5(length: int) -> Verdict:
    return Verdict(Outcome.INT3, f"{length}-byte NOP: only 5-byte NOPs are optimized",
                   SITE_NOT_NOP5.code)


@lru_cache(maxsize=64)
def _not_nop10(reason_618: str) -> Verdict:
    return Verdict(Outcome.INT3, reason_618 + "; the series optimizes only 66 2e 0f 1f 84 "
                   "nop10 sites", SITE_NOT_NOP10.code)


def optimized_where_it_is(code: bytes, address: int, *, nop10: bool = False) -> bool:
    """True when the kernel optimizes a uprobe on the instruction `code` at `address` in a
    64-bit process, the trampoline aside: what a rewrite asks of a site it keeps or makes
    (`nop10`: under the experimental nop10 series, for the combo10 form)."""
    rule = rule_nop10 if nop10 else rule_618
    return rule(code, address).outcome.optimized
