"""Whether the prover models a window's instructions: `check`'s cheap prediction of which
sites a rewrite proves (no engine is loaded: the window's decoded instructions are read).

A window is predicted provable (if the rewrite moves it to a detour; one written in place
has no detour to prove) when it has no way in from outside (those are left to the
emulator), and none of its instructions is one the prover refuses: a system call or
interrupt, rdtsc and the other reads of machine state (cpuid, rdrand, xgetbv, ...), x87
(the register stack is indexed guest state), `rep`-prefixed string instructions (a loop of
unknown length), integer division (its query does not finish in the budget), port I/O,
hlt, ud2, int3. The proof itself can still leave a
predicted site to the emulator (its solver budget, a VEX construct it does not model):
docs/rewrite.md, "Proved, not sampled".
"""

from __future__ import annotations

from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.x86.decode import CodeInsn

_REFUSED = frozenset({
    "syscall", "sysenter", "sysexit", "sysret", "int", "int1", "int3", "into", "iret",
    "iretq", "ud2", "ud0", "ud1", "hlt", "rdtsc", "rdtscp", "rdpmc", "rdrand", "rdseed",
    "rdpid", "cpuid", "xgetbv", "xsetbv", "in", "out", "ins", "outs", "insb", "insw", "insd",
    "outsb", "outsw", "outsd", "div", "idiv", "wait", "emms", "femms", "xabort", "xbegin",
    "xend", "xtest", "pause",
})
_REFUSED_STEMS = ("xsave", "xrstor", "fxsave", "fxrstor", "rdfsbase", "rdgsbase", "wrfsbase",
                  "wrgsbase")
_INT_SUFFIX = ("b", "w", "l", "q")


def refused(insn: CodeInsn) -> str | None:
    """Why the prover refuses `insn`, or None."""
    full = insn.mnemonic
    name = insn.base_mnemonic or full.split()[-1]
    stem = name[:-1] if name[-1:] in _INT_SUFFIX and name[:-1] in _REFUSED else name
    if full.startswith(("rep", "repe", "repz", "repne", "repnz")) and \
            name.rstrip("bwlq") in ("movs", "stos", "lods", "cmps", "scas", "ins", "outs"):
        return f"{full}: a rep-prefixed string instruction"
    if name in _REFUSED or stem in _REFUSED:
        return f"{insn.text}: not modelled"
    if name.startswith(_REFUSED_STEMS):
        return f"{insn.text}: machine state not modelled"
    if name.startswith("f"):
        return f"{insn.text}: x87"
    return None


def provable(window: PatchWindow) -> str | None:
    """None when the prover is expected to prove the window's detour, else why not."""
    if window.retargets:
        return "ways in from outside the window are left to the emulator"
    if window.entry_stub is not None:
        return "a short window's jmp rel8 through its stub is left to the emulator"
    for ins in window.insns:
        why = refused(ins)
        if why is not None:
            return why
    return None
