"""What moving an instruction changes for whoever observes its pc (docs/rewrite.md, "What a
moved instruction's pc and a moved call's return address look like"), decided here, below
both `check` (analysis/check.py, through analysis/windows.find_window and the re-laid
window's test) and the rewrite's plan, so that both make the one decision.

- A system-call instruction (`syscall`, `sysenter`, `int N`) never moves: the kernel,
  seccomp filters (`instruction_pointer`), SIGSYS handlers (`si_call_addr`) and audit see its
  pc (`window-syscall`).
- An instruction that can fault does not move where a signal handler of the file may
  recognise the fault by its pc: the file can install a handler (it links against
  `sigaction`, `signal`, ...) and its code compares an address of the instruction's function
  (its start, or a label from the start up to the instruction) with a value
  (`window-fault-observed`). Elsewhere it moves, and the rewrite's report says where a fault
  of it is now reported (`fault_pcs`).

A moved call's return address is the other observed value: analysis/calls.py decides it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from usdtpatch.analysis.waysin import (
    CODE_WORD,
    RELOCATION,
    code_words_of,
    references_to,
    relocations_to,
)
from usdtpatch.analysis.windows import Pinned
from usdtpatch.elf.image import ElfImage
from usdtpatch.elf.symbols import symbol_names
from usdtpatch.findings import WINDOW_FAULT_OBSERVED, WINDOW_SYSCALL
from usdtpatch.x86.decode import CodeInsn, Flow, sweep
from usdtpatch.x86.regs import alias, sized

# What installs a signal handler (the names a file links against, or a static file defines).
SIGNAL_INSTALLERS = frozenset({"sigaction", "signal", "sigset", "bsd_signal", "sigvec",
                               "__sysv_signal", "ssignal"})
_TRAPS = frozenset({"ud2", "ud1", "ud0", "int3", "hlt", "into", "bound"})
_DIVIDES = frozenset({"div", "idiv", "divb", "divw", "divl", "divq", "idivb", "idivw", "idivl",
                      "idivq"})
_NO_ACCESS = ("nop", "lea", "prefetch", "endbr", "clflush", "clflushopt", "clwb")
_COMPARES = sized("cmp", "sub")
_KEEPS = sized("add", "sub", "and")  # reg op= immediate
USE_WINDOW = 6  # instructions after a lea or GOT load read for the comparison


def system_call(ins: CodeInsn) -> bool:
    """`syscall`, `sysenter`, `int N`: the kernel sees the pc."""
    return ins.flow is Flow.SYSCALL


def may_fault(ins: CodeInsn) -> bool:
    """Whether the instruction can raise a synchronous signal (SIGSEGV, SIGBUS, SIGFPE,
    SIGILL, SIGTRAP) at its own pc: a memory access not through %rsp/%rbp (a stack slot),
    %rip (the file's own data) or %fs/%gs alone (the thread's TLS block), a division, a trap,
    an indirect branch through memory."""
    base = (ins.base_mnemonic or ins.mnemonic).split()[-1]
    if base.startswith(_NO_ACCESS):
        return False
    if base in _TRAPS or base in _DIVIDES or ins.flow is Flow.STOP:
        return True
    m = ins.mem
    if m is None or (m.segment in ("fs", "gs") and m.base is None and m.index is None):
        return False  # no memory operand, or a thread's own TLS block
    # a stack slot, or the file's own data (rip-relative): mapped
    return m.base not in ("rsp", "rbp", "rip") or m.index is not None


@dataclass(frozen=True, slots=True)
class PcObservers:
    """Who may observe a moved instruction's pc, for one file: why the file can install a
    signal handler (None: it cannot), and the code addresses its code compares with a value
    (address -> what compares it)."""

    handler: str | None
    compared: dict[int, str] = field(default_factory=dict)

    def pinned(self, function_start: int) -> Pinned:
        """The test find_window applies to each instruction of a window in the function
        starting at `function_start`."""
        def test(ins: CodeInsn) -> tuple[str, str] | None:
            if system_call(ins):
                return WINDOW_SYSCALL.code, (
                    f"{ins.address:#x} ({ins.text}) is a system call: the kernel, seccomp "
                    f"filters and SIGSYS handlers see its pc, which must not move")
            if self.handler is None or not may_fault(ins):
                return None
            by = next((f"{a:#x} ({what})" for a, what in sorted(self.compared.items())
                       if function_start <= a <= ins.address), None)
            if by is None:
                return None
            return WINDOW_FAULT_OBSERVED.code, (
                f"{ins.address:#x} ({ins.text}) can fault, the file can install a signal "
                f"handler ({self.handler}) and its code compares the address {by}: a "
                f"handler would see a fault at {ins.address:#x} at another pc")
        return test


NO_OBSERVERS = PcObservers(None)


def signal_handler_installer(image: ElfImage) -> str | None:
    """Why the file can install a signal handler (None: it cannot): the names it links
    against (or, a static file, defines)."""
    names = sorted(set(symbol_names(image)) & SIGNAL_INSTALLERS)
    return f"it links against {', '.join(names)}" if names else None


def pc_observers(image: ElfImage, regions: Iterable[tuple[int, int, int]]) -> PcObservers:
    """Who observes a moved pc in `image`, for the code of `regions` (function start, lo,
    hi): the addresses compared are looked for at each function start and in [lo, hi)."""
    handler = signal_handler_installer(image)
    if handler is None:
        return NO_OBSERVERS
    targets: set[int] = set()
    ranges: list[tuple[int, int]] = []
    for start, lo, hi in regions:
        targets.add(start)
        targets.update(range(max(start, lo), hi))
        ranges += [(start, start + 1), (max(start, lo), hi)]
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return PcObservers(handler, compared_addresses(image, targets, merged))


def compared_addresses(image: ElfImage, targets: set[int],
                       spans: list[tuple[int, int]] | None = None) -> dict[int, str]:
    """Of `targets`, the addresses the file's code compares with a value: a rip-relative
    `lea` of it (or, in a fixed-address file, a `mov`/`movabs` immediate) whose register a
    `cmp`/`sub` reads within USE_WINDOW instructions, a `cmp` with it as an immediate, a GOT
    slot holding it that code loads the same way or compares with (`cmp slot(%rip),%reg`)."""
    out: dict[int, str] = {}
    for src, _name, t in references_to(image, targets, ("lea",), spans):
        if _compared_after(image, _rex(image, src)):
            out.setdefault(t, f"rip-relative lea at {src:#x}, then compared")
    for w in code_words_of(image, targets):
        at = _holding(image, w.source, w.target) if w.kind == CODE_WORD else None
        if at is not None and (at[1] or _compared_after(image, at[0])):
            out.setdefault(w.target, f"immediate at {at[0]:#x}, compared")
    got = {w.source: w.target for w in relocations_to(image, targets) if w.kind == RELOCATION
           and _in_got(image, w.source)}
    for src, name, slot in references_to(image, set(got), ("mov", "cmp")):
        if name == "cmp" or _compared_after(image, _rex(image, src)):
            out.setdefault(got[slot], f"its GOT slot {slot:#x}, read at {src:#x} and compared")
    return out


def _in_got(image: ElfImage, place: int) -> bool:
    return any(s.name in (".got", ".got.plt") and s.addr <= place < s.addr + s.size
               for s in image.sections)


def _rex(image: ElfImage, src: int) -> int:
    """The start of the instruction whose opcode is at `src` (its REX prefix, if any)."""
    return src - 1 if 0x40 <= (image.read_vaddr(src - 1, 1) or b"\0")[0] < 0x50 else src


def _holding(image: ElfImage, place: int, value: int) -> tuple[int, bool] | None:
    """(start, whether it is a cmp) of the instruction whose immediate is at `place` and
    holds `value`, or None."""
    for k in (1, 2, 3):
        insns = sweep(image.read_vaddr(place - k, 15), place - k, image.is64).insns
        if insns and insns[0].end in (place + 4, place + 8) and \
                f"${value:#x}" in insns[0].op_str:
            base = (insns[0].base_mnemonic or insns[0].mnemonic).split()[-1]
            return insns[0].address, base in _COMPARES
    return None


def _compared_after(image: ElfImage, start: int) -> bool:
    """Whether the instruction at `start` (a rip-relative lea or mov, or a mov immediate,
    into a register) is followed, before the register changes or control leaves, by a
    cmp/sub that reads the register."""
    insns = sweep(image.read_vaddr(start, 15 * (USE_WINDOW + 1)), start, image.is64).insns
    if not insns or insns[0].address != start:
        return False
    ops = insns[0].operands
    if not ops or not ops[-1].startswith("%"):
        return False
    reg = alias(ops[-1])
    for ins in insns[1:USE_WINDOW + 1]:
        base = (ins.base_mnemonic or ins.mnemonic).split()[-1]
        ops = [alias(o) for o in ins.operands]
        if reg in ops and base in _COMPARES:
            return True
        if ins.flow is not Flow.NONE:
            return False
        if ops and ops[-1] == reg and not (base in _KEEPS and ops[0].startswith("$")):
            return False  # the register is written
    return False
