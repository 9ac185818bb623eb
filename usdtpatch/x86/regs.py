"""x86-64 general registers: the 64-bit name of each alias, and the registers instructions
write besides their last operand. One table for every analysis that follows a register's
value (usdtpatch.analysis.targets and .hazards, usdtpatch.forkguard.dso)."""

from __future__ import annotations

from functools import cache

ALIASES: dict[str, str] = {}
for _r in ("ax", "bx", "cx", "dx"):
    for _n in (f"r{_r}", f"e{_r}", _r, f"{_r[0]}l", f"{_r[0]}h"):
        ALIASES[_n] = f"r{_r}"
for _r in ("si", "di", "bp", "sp"):
    for _n in (f"r{_r}", f"e{_r}", _r, f"{_r}l"):
        ALIASES[_n] = f"r{_r}"
for _i in range(8, 16):
    for _s in ("", "d", "w", "b"):
        ALIASES[f"r{_i}{_s}"] = f"r{_i}"

CALLER_SAVED = frozenset({"rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11"})


def reg64(name: str) -> str | None:
    """The 64-bit name of a general register (`%eax`, `ax`, `al` -> rax; `r8d` -> r8), or
    None when `name` is no general register."""
    return ALIASES.get(name.strip().lstrip("*%"))


def alias(name: str) -> str:
    """reg64, or the name itself (without `%` and `*`) when it is no general register."""
    r = name.lstrip("*%")
    return ALIASES.get(r, r)


@cache
def sized(*names: str) -> frozenset[str]:
    """AT&T mnemonics with and without their size suffixes (memoized: the analysis asks for
    the same few sets once per instruction it reads)."""
    return frozenset(n + sfx for n in names for sfx in ("", "b", "w", "l", "q"))


_STRING_DI = sized("movs", "stos", "scas", "cmps", "ins")
_STRING_SI = sized("movs", "lods", "cmps", "outs")
_MULDIV = sized("mul", "div", "idiv")  # one operand: writes rdx:rax (imul: when 1 operand)
# register -> the mnemonics that write it implicitly (not as their last operand)
IMPLICIT_WRITES: dict[str, frozenset[str]] = {
    "rax": _MULDIV | sized("lods", "cmpxchg") | frozenset(
        {"cqto", "cltq", "cwtl", "cltd", "cwtd", "cpuid", "rdtsc", "rdtscp", "xgetbv",
         "syscall", "rdpid", "rdrand", "rdseed", "lahf"}),
    "rdx": _MULDIV | frozenset({"cqto", "cltd", "cwtd", "cpuid", "rdtsc", "rdtscp",
                                "xgetbv", "rdmsr"}),
    "rcx": frozenset({"cpuid", "syscall", "rdtscp", "loop", "loope", "loopne"}),
    "rbx": frozenset({"cpuid"}),
    "rdi": _STRING_DI,
    "rsi": _STRING_SI,
    "r11": frozenset({"syscall"}),
}
# mnemonic prefixes of the instructions that write registers besides (or other than) their
# last operand, for an analysis that forgets every register there (the coarse reading)
CLOBBERS_MORE = ("mul", "imul", "div", "idiv", "cq", "cd", "cl", "cw", "cpuid", "rdtsc",
                 "syscall", "xchg", "cmpxchg", "xadd", "rep", "movs", "stos", "lods", "scas",
                 "cmps", "enter", "int")
# mnemonic prefixes of instructions that only read their operands
READ_ONLY = ("cmp", "test", "bt", "nop", "endbr", "prefetch", "ucomis", "comis")
