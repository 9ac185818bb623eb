"""What usdtpatch knows of the x86-64 Linux kernels it writes for, held once (docs/kernel.md):
the page, the uprobe syscall, and the table of kernel generations.

A *generation* is what a kernel does with a uprobe on a NOP, named by what it optimizes:
`none` (no uprobe syscall: every site stays on the int3 path), `nop5` (a 5-byte NOP becomes
`call trampoline`; the call and the trampoline's pushes write the 32 bytes below %rsp, and a
child forked while a site is optimized crashes there) and `nop10` (only the 10-byte NOP
`66 2e 0f 1f 84 ..` is optimized, into `lea -0x80(%rsp),%rsp; call trampoline`; nothing below
the red zone is written and fork keeps the trampoline). A release number does not tell them
apart (stable and distribution backports move the series): the uprobe syscall's answer from
outside a trampoline does, ENOSYS, ENXIO or EPROTO. The releases in each row are where it was
measured, examples, never the rule.

Every module that needs a generation's fact reads its row here: the rule engine
(analysis/rules.py), the write sequences (sequences/), the emulator, kcheck and bench (live/),
the rewrite's form and guards, the reports. None of them names a generation's errno, bytes or
protocol (tests/test_kernelfacts.py holds that). Adding a generation is a row and its tests,
run live in a guest (tests/test_live_guest_*.py).

Plain data and pure functions but one: `uprobe_syscall_errno` asks the running kernel.
Deferred imports: ctypes, platform and sys, inside it, so that a command that never asks does
not load them.
This module imports nothing of usdtpatch: every layer may import it, `elf/` and `x86/` too.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

PAGE = 4096  # the page: the kernel writes a site within one, the trampoline is one
UPROBE_SYSCALL = 336  # x86-64; another syscall on other architectures
RED_ZONE = 128  # the x86-64 SysV psABI's red zone below %rsp
CALL_REL32 = 0xE8  # call rel32: what an optimized site calls the trampoline with
INT3 = 0xCC  # int3: what a uprobe writes over byte 0 of a site first
LEA_RSP_DOWN = bytes([0x48, 0x8D, 0x64, 0x24, 0x80])  # lea -0x80(%rsp),%rsp
ERRNO_UNPROBEABLE = 524  # ENOTSUPP: perf_event_open's refusal of an instruction it cannot probe

# The trampoline page's code (measured on 6.18.44; 7.3 returns with `ret $0x80`): 19 or 21
# bytes at the start of the page, the rest zero.
_TRAMPOLINE_BODY = bytes([
    0x51,  # push %rcx
    0x41, 0x53,  # push %r11
    0x50,  # push %rax
    0x48, 0xC7, 0xC0, 0x50, 0x01, 0x00, 0x00,  # mov $0x150,%rax   (336: the uprobe syscall)
    0x0F, 0x05,  # syscall
    0x58,  # pop %rax
    0x41, 0x5B,  # pop %r11
    0x59,  # pop %rcx
])


@dataclass(frozen=True, slots=True)
class Generation:
    """One kernel generation: how it is told apart and what it does with a uprobe on a NOP.

    The optimize sequence of every optimizing generation is the same shape (the kernel's
    `int3_update`): int3 at byte 0 (at attach), then bytes 1..n-1 of the optimized bytes, then
    byte 0; unoptimize is int3 at byte 0, bytes 1..`restored` of the original, then byte 0
    (7.3 leaves `e8 rel32` in bytes 5..9, which decode as the same NOP's SIB and disp32).
    """

    name: str  # what it optimizes: `--kernel NAME`, the reports' column, the plan's protocol
    aliases: tuple[str, ...]  # other spellings a user may have written (`--kernel 6.18`)
    errno: int  # the uprobe syscall's errno, called from outside a trampoline
    examples: tuple[str, ...]  # releases measured with this behaviour (examples, not the rule)
    nop_length: int  # the length of the one NOP it optimizes (0: it optimizes nothing)
    nop_head: bytes  # the bytes that NOP starts with (b"": any NOP of that length but a hint)
    optimized_head: bytes  # written before `e8 rel32` (the call ends at site + nop_length)
    rsp_moved: int  # how far that head moves %rsp down before the call (the trampoline's
    #                 return moves it back)
    restored: int  # bytes 1..restored the unoptimize sequence writes back before byte 0
    writes_below_rsp: int  # bytes below %rsp an optimized hit writes (32: the red zone's top)
    fork_keeps_sites: bool  # a child forked while a site is optimized runs it (trampoline copied)
    next_form: str  # the `90` + NOP site form whose consumers attach at pc + 1 on it
    next_consumer: str  # who attaches there, in words
    auto_form: str | None  # the rewrite form `--form auto` writes for it (None: none)
    trampoline_ret: bytes  # the trampoline's return (`ret`, or `ret $0x80` after the lea)

    @property
    def optimizes(self) -> bool:
        return self.nop_length > 0

    @property
    def call_offset(self) -> int:
        """Where the `e8 rel32` of an optimized site starts, from the site."""
        return len(self.optimized_head)

    @property
    def trampoline(self) -> bytes:
        """The trampoline page's code (b"" for a generation without one)."""
        if not self.optimizes:
            return b""
        return _TRAMPOLINE_BODY + self.trampoline_ret + bytes([INT3])

    @property
    def red_zone_hazard(self) -> bool:
        """An optimized hit writes into the 128 bytes below %rsp a function may keep live."""
        return self.writes_below_rsp > 0

    @property
    def label(self) -> str:
        """The name with the releases it was measured on, for a report's heading."""
        return f"{self.name} ({', '.join(self.examples)})" if self.examples else self.name

    def optimized(self, rel32: int) -> bytes:
        """The bytes of an optimized site whose call's displacement is `rel32`."""
        return self.optimized_head + bytes([CALL_REL32]) + rel32.to_bytes(4, "little",
                                                                           signed=True)

    def accepts(self, code: bytes, length: int, hint: bool) -> bool:
        """True when a NOP of `length` bytes at code[0] (`hint`: 0f 1f /r with ModRM.reg != 0)
        is the one this generation optimizes."""
        return (self.optimizes and length == self.nop_length and not hint
                and code.startswith(self.nop_head))

    def probeable(self, code: bytes, prefixes: bytes) -> bool:
        """False when the kernel refuses to probe the NOP at code[0] (prefixes: its legacy
        prefixes): a CS or DS segment prefix (errno 524; a system-wide probe is silently lost,
        0 hits), unless it is the very NOP this generation optimizes."""
        if not set(prefixes) & SEGMENT_PREFIXES_UNPROBEABLE:
            return True
        return bool(self.nop_head) and code.startswith(self.nop_head)


SEGMENT_PREFIXES_UNPROBEABLE = frozenset({0x2E, 0x3E})  # CS, DS

# The table. Rows in the order the generations came; the first is the one that optimizes
# nothing. Where each fact was measured: docs/kernel.md.
GENERATIONS: tuple[Generation, ...] = (
    Generation(name="none", aliases=(), errno=errno.ENOSYS, examples=("6.1",),
               nop_length=0, nop_head=b"", optimized_head=b"", rsp_moved=0, restored=0,
               writes_below_rsp=0, fork_keeps_sites=True, next_form="", next_consumer="",
               auto_form=None, trampoline_ret=b""),
    Generation(name="nop5", aliases=("6.18",), errno=errno.ENXIO, examples=("6.18",),
               nop_length=5, nop_head=b"", optimized_head=b"", rsp_moved=0, restored=4,
               writes_below_rsp=32, fork_keeps_sites=False, next_form="combo5",
               next_consumer="libbpf 1.7 attaches there; bcc, bpftrace 0.17, perf and gdb "
                             "attach at pc, the 1-byte nop",
               auto_form="nop5", trampoline_ret=bytes([0xC3])),  # ret
    Generation(name="nop10", aliases=("nop10-series",), errno=errno.EPROTO,
               examples=("7.3", "7.2.13"),
               nop_length=10, nop_head=bytes([0x66, 0x2E, 0x0F, 0x1F, 0x84]),  # cs nopw d32(,)
               optimized_head=LEA_RSP_DOWN, rsp_moved=RED_ZONE, restored=4,
               writes_below_rsp=0,
               fork_keeps_sites=True, next_form="combo10",
               next_consumer="the libbpf of the 7.3 tree attaches there; bcc, bpftrace, perf "
                             "and gdb attach at pc, the 1-byte nop",
               auto_form="combo10", trampoline_ret=bytes([0xC2, 0x80, 0x00])),  # ret $0x80
)
OPTIMIZING: tuple[Generation, ...] = tuple(g for g in GENERATIONS if g.optimizes)
# What `rewrite`, `check`, `plan` and the build steps target when no --kernel is named: the
# nop5 path (6.18.y, a long-term kernel in the field). docs/rewrite.md, "Which generation".
DEFAULT = OPTIMIZING[0]
NAMES: tuple[str, ...] = tuple(g.name for g in GENERATIONS)
# every spelling `--kernel` takes: the names of the optimizing generations and their aliases
CHOICES: tuple[str, ...] = tuple(n for g in OPTIMIZING for n in (g.name, *g.aliases))


def generation(name: str) -> Generation:
    """The generation `name` (or an alias of it) names; ValueError naming the choices."""
    for g in GENERATIONS:
        if name == g.name or name in g.aliases:
            return g
    raise ValueError(f"kernel must be one of {', '.join(CHOICES)}, not {name!r}")


def generation_of_nop(length: int) -> Generation | None:
    """The generation that optimizes a NOP of `length` bytes (None: no generation does)."""
    return next((g for g in OPTIMIZING if g.nop_length == length), None)


def uprobe_syscall_errno() -> int | None:
    """errno of the uprobe syscall called from here (outside any trampoline); None when this
    is not x86-64 Linux (336 is another syscall elsewhere) or the call returned 0."""
    import ctypes
    import platform
    import sys

    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(UPROBE_SYSCALL))
    return ctypes.get_errno() if rc == -1 else None


def generation_of_errno(e: int | None) -> tuple[Generation | None, str]:
    """The generation whose uprobe syscall answers `e` and why, in words. The row `none` for
    ENOSYS (a kernel without the syscall: it optimizes nothing); None for no answer (not x86-64
    Linux) or an answer no known generation gives."""
    for g in GENERATIONS:
        if e == g.errno:
            name = errno.errorcode.get(e, str(e))
            if not g.optimizes:
                return g, f"the kernel has no uprobe syscall ({name}): it optimizes no uprobe"
            return g, (f"the uprobe syscall answers {name}: the {g.name} generation "
                       f"(measured on {', '.join(g.examples)})")
    if e is None:
        return None, "not an x86-64 Linux kernel with the uprobe syscall"
    name = errno.errorcode.get(e, str(e))
    return None, f"the uprobe syscall answers {name}, which no known kernel generation does"


def kernel_of_errno(e: int | None) -> tuple[Generation | None, str]:
    """The optimizing generation whose uprobe syscall answers `e` (None: a kernel that
    optimizes no uprobe, or an answer no known generation gives) and why, in words."""
    g, why = generation_of_errno(e)
    return (g if g is not None and g.optimizes else None), why
