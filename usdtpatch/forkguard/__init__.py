"""The fork guard: optimized sites must not crash a child forked while they are traced.

On Linux 6.18 the uprobe trampoline page is not copied by fork: a child inherits every site
its parent had optimized (`e8 rel32`, a call into the trampoline) but not the page the call
goes to, and dies with SIGSEGV at its first hit. The guard runs in every forked child (an
atfork child handler) and, for each site of its object whose bytes are such a call into a page
the child does not have, writes back the kernel's int3 state (`cc` + the site's bytes 1..4)
through /proc/self/mem. The next hit traps, the probe fires for the child, and the kernel
optimizes the site again in the child. docs/fork-guard.md has the whole story.

This package holds the guard's code (rearm.c, built by recipe.py into _code.py), its reader
(reader.py: whether a file carries a guard and the sites its table lists, what `check` and
`verify` read; it analyses no code) and, here, the builder: `build_guard`, the rewriter's
seam (and the fork evidence it asks usdtpatch.analysis for, imported where it is asked:
analysis/check.py imports the reader, the builder imports the analysis): the code, the site
table and two stubs for the new segment, and the in-place edits that make the object
register the guard when it loads:

- a dynamically linked object: its first DT_INIT_ARRAY entry (the R_X86_64_RELATIVE addend
  that fills it in a PIE or shared object, the pointer itself in a non-PIE executable), or
  DT_INIT when there is no init array, is pointed at the init stub, which calls
  usdtpatch_register(envp, child stub, dso handle) and jumps to the original. The register
  function finds glibc's `__register_atfork` without an import (AT_BASE from /proc/self/auxv,
  or the auxiliary vector after the initial envp -> the dynamic linker's `_r_debug` -> the
  link map -> each object's GNU hash table);
- a static executable: the same hook, and the stub calls `__register_atfork` directly, at the
  address its symbol table gives.

Layout of GuardBuild.text (at `place_at`, 16-byte aligned):
  +0            child stub: lea table(%rip),%rdi; lea table_end(%rip),%rsi; jmp rearm
  +32           init stub (see above), ending with a jmp to the original init function
  +80           rearm.c's block (_code.CODE)
  after it      the site table, 12 bytes a site: int32 site - entry, the site's 5 bytes, 0 0 0
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from usdtpatch.analysis.computed import file_ways_in
from usdtpatch.analysis.debuglines import window_debug_refusal
from usdtpatch.analysis.forkexposure import (
    LOOKUPS,
    NON_FORKING_LIBRARIES,
    constructor_route,
    fork_exposure,
)
from usdtpatch.analysis.forkexposure import evidence as _evidence
from usdtpatch.analysis.forkexposure import libraries_that_may_fork as _libraries_that_may_fork
from usdtpatch.analysis.functions import FunctionBounds
from usdtpatch.analysis.guardfile import (
    ENTRY_SIZE,
    TABLE_SECTION,
    Coverage,
    GuardUnsupported,
    TableEntry,
    c_library,
    coverage,
    header_table,
    is_shared,
    object_kind,
    read_table,
)
from usdtpatch.analysis.targets import CodeContext, FunctionCode
from usdtpatch.elf.cfi import CfiError, CfiIndex, load_cfi
from usdtpatch.elf.image import (
    EM_X86_64,
    ET_DYN,
    PT_GNU_RELRO,
    ElfImage,
)
from usdtpatch.elf.model import (
    DT_INIT,
    DT_INIT_ARRAY,
    DT_INIT_ARRAYSZ,
    DT_PREINIT_ARRAY,
    DT_PREINIT_ARRAYSZ,
    DT_RELA,
    DT_RELAENT,
    DT_RELASZ,
    DT_RELR,
    DT_RELRSZ,
    R_X86_64_RELATIVE,
    dynamic_entries,
    spare_dynamic_slots,
)
from usdtpatch.elf.relocs import RelaTable, import_slots
from usdtpatch.elf.symbols import load_symbols, symbol_value
from usdtpatch.errors import UsdtpatchError
from usdtpatch.forkguard import _code
from usdtpatch.forkguard.dso import find_dso_handle  # only for a stripped object
from usdtpatch.x86.decode import Flow
from usdtpatch.x86.nops import GUARD_ENTER, GUARD_LEAVE, NOP5, crosses_page, kernel_optimizable_nop5

__all__ = ["ENTRY_SIZE", "LOOKUPS", "NON_FORKING_LIBRARIES", "TABLE_SECTION", "Coverage",
           "GuardBuild", "GuardUnsupported", "TableEntry", "build_guard", "coverage",
           "fork_exposure", "fork_syscall_hooks", "guarded_sites", "header_table",
           "hook_problem", "is_shared", "marker_entry", "read_table"]

_dynamic = dynamic_entries  # (the builder's names for the reader's)
_kind = object_kind

if TYPE_CHECKING:
    from usdtpatch.analysis.targets import CodeContext

CHILD_STUB = 0
INIT_STUB = 32
CODE_AT = 80
# right before the init stub: how another rewritten object's child re-arms this one's sites
# (rearm.c, usdtpatch_rearm_all, finds it at the object's hooked init function; never run)
GUARD_MARK = b"\xeb\x08USDTguar"  # jmp .+10; "USDTguar"



@dataclass(frozen=True, slots=True)
class GuardBuild:
    """The guard for one rewritten file.

    `text` goes at `address` in the new segment; `patches` are in-place edits (file offset,
    new bytes); `symbols` are (name, address, size) for the output's symbol table; `hook`
    says in words how the object registers the guard. `checked` counts the hooked system
    calls whose number the code does not fix, compared with the fork ones at run time: a
    static executable's hooks cover every such call (what check reports as `fork-unknown`)
    or the guard is not built.
    """

    address: int
    text: bytes
    patches: tuple[tuple[int, bytes], ...]
    sites: tuple[int, ...]
    table: int
    symbols: tuple[tuple[str, int, int], ...]
    hook: str
    checked: int = 0
    # the [start, end) of each hooked system call's window (moved to the hook): the line
    # rows inside leave it (rewriter/build.py)
    hooked: tuple[tuple[int, int], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.text


def guarded_sites(sites: tuple[tuple[int, bytes], ...] | list[tuple[int, bytes]]
                  ) -> tuple[tuple[int, bytes], ...]:
    """The sites a 6.18 kernel optimizes (a 5-byte NOP within one page): the ones to guard."""
    return tuple((a, bytes(b)) for a, b in sites
                 if len(b) == 5 and kernel_optimizable_nop5(b) and not crosses_page(a, 5))


# the C library's own fork functions: the fork system call there runs the atfork handlers
# (the guard's registration) through fork()
LIBC_FORK_FUNCTIONS = frozenset({"_Fork", "__libc_fork", "fork", "__fork", "_IO_new_fork"})


def _bypassing(image: ElfImage, kind: str) -> list[tuple[int, str]]:
    """The system calls of the file's code that may fork a copy of the process without going
    through the C library's fork() (whose atfork handlers the guard registers with): a fork
    or clone system call outside the C library's fork functions, one whose number the code
    does not fix, a call of syscall() with a fork number or with a number not fixed (a shared
    object: none; its calls of syscall() are reported by check, `fork-unknown`, not refused:
    docs/rewrite.md, "What is not covered")."""

    if kind == "shared":
        return []
    ev = _evidence(image, True)
    symbols = load_symbols(image) if ev.forks else None
    out = list(ev.unknown)
    for pc, what in ev.forks:
        sym = symbols.lookup(pc) if pc and symbols is not None else None
        if sym is None or sym[0].name not in LIBC_FORK_FUNCTIONS:
            out.append((pc, what))
    return out


# --- reading the file --------------------------------------------------------------------

def _offset(image: ElfImage, vaddr: int, size: int, what: str) -> int:
    off = image.vaddr_to_offset(vaddr)
    if off is None or len(image.read_vaddr(vaddr, size)) != size:
        raise GuardUnsupported(f"{what} at {vaddr:#x} is not in the file")
    return off


def _relas(image: ElfImage, dyn: dict[int, int]) -> RelaTable:
    """The DT_RELA table, by column (iterating it yields (file offset of the entry, r_offset,
    type, addend))."""
    if DT_RELA not in dyn or not dyn.get(DT_RELASZ):
        return RelaTable(image, 0, 0)
    if dyn.get(DT_RELAENT, 24) != 24:
        raise GuardUnsupported(f"DT_RELAENT {dyn[DT_RELAENT]} is not 24")
    start = _offset(image, dyn[DT_RELA], dyn[DT_RELASZ], "DT_RELA")
    return RelaTable(image, start, dyn[DT_RELASZ])


def _relr_covers(image: ElfImage, dyn: dict[int, int], vaddr: int) -> bool:
    """Whether DT_RELR relocates the word at `vaddr` (a relative relocation whose addend is
    the word itself)."""
    if DT_RELR not in dyn or not dyn.get(DT_RELRSZ):
        return False
    start = _offset(image, dyn[DT_RELR], dyn[DT_RELRSZ], "DT_RELR")
    where = 0
    for off in range(start, start + dyn[DT_RELRSZ] - 7, 8):
        (word,) = struct.unpack_from("<Q", image.data, off)
        if word & 1 == 0:
            if word == vaddr:
                return True
            where = word + 8
        else:
            bits = word >> 1
            for i in range(63):
                if bits >> i & 1 and where + 8 * i == vaddr:
                    return True
            where += 63 * 8
    return False


def _symbol(image: ElfImage, name: str) -> int | None:
    """The value of a defined `.symtab` symbol called `name`, or None."""
    return symbol_value(image, name)


def _dso_handle(image: ElfImage, relas: RelaTable) -> int:
    """The address of a shared object's `__dso_handle` (what glibc's pthread_atfork passes,
    so that the handler is dropped when the object is unloaded): its symbol, or else the word
    the object's own code passes to __cxa_finalize / __cxa_atexit (forkguard/dso.py). Raises
    GuardUnsupported when neither tells."""
    sym = _symbol(image, "__dso_handle")
    if sym is not None:
        return sym

    found = find_dso_handle(image, {t: v for t, v, _o in _dynamic(image)}, relas)
    if found.address is None:
        raise GuardUnsupported(f"shared object without a __dso_handle ({found.reason}): a "
                               "guard could not be unregistered when the object is unloaded")
    return found.address


def _find_hook(image: ElfImage, dyn_entries: list[tuple[int, int, int]],
               relas: RelaTable, preinit: bool = False
               ) -> tuple[int, str, list[tuple[int, int]]]:
    """(original init function, description, [(file offset, width)] to receive the stub's
    address) for the object's first init function: with `preinit` (a glibc executable) its
    DT_PREINIT_ARRAY[0] when it has one (glibc runs an executable's preinit functions before
    every other initializer of the process: its DT_INIT, its init array, the constructors of
    the libraries it loads), else DT_INIT_ARRAY[0], else DT_INIT."""
    dyn = {t: v for t, v, _o in dyn_entries}
    arrays = [(DT_INIT_ARRAY, DT_INIT_ARRAYSZ, "DT_INIT_ARRAY")]
    if preinit:
        arrays.insert(0, (DT_PREINIT_ARRAY, DT_PREINIT_ARRAYSZ, "DT_PREINIT_ARRAY"))
    for tag, sz_tag, label in arrays:
        arr, arrsz = dyn.get(tag), dyn.get(sz_tag, 0)
        if arr is not None and arrsz >= 8:
            return _array_hook(image, dyn, relas, arr, label)
    init = next(((v, o) for t, v, o in dyn_entries if t == DT_INIT), None)
    if init is not None and init[0]:
        return init[0], "DT_INIT", [(init[1] + 8, 8)]
    raise GuardUnsupported("the file has neither DT_INIT_ARRAY nor DT_INIT to hook")


def _array_hook(image: ElfImage, dyn: dict[int, int], relas: RelaTable, arr: int, label: str
                ) -> tuple[int, str, list[tuple[int, int]]]:
    """_find_hook's answer for the first word of the init (or preinit) array at `arr`."""
    slot_off = _offset(image, arr, 8, label)
    (slot,) = struct.unpack_from("<Q", image.data, slot_off)
    rels = relas.at(arr)
    if len(rels) > 1:
        raise GuardUnsupported(f"{label}[0] at {arr:#x} has {len(rels)} relocations")
    if rels:
        roff, rtype, addend = rels[0]
        if rtype != R_X86_64_RELATIVE:
            raise GuardUnsupported(f"{label}[0] at {arr:#x} is filled by relocation "
                                   f"type {rtype}, not R_X86_64_RELATIVE")
        target = addend
        where = [(roff + 16, 8)]
        if slot == addend and slot:
            where.append((slot_off, 8))
        how = f"{label}[0] (R_X86_64_RELATIVE addend at {arr:#x})"
    elif image.type == ET_DYN and _relr_covers(image, dyn, arr):
        target, where = slot, [(slot_off, 8)]
        how = f"{label}[0] (the DT_RELR-relocated word at {arr:#x})"
    elif image.type == ET_DYN and slot:
        raise GuardUnsupported(f"{label}[0] at {arr:#x} has no relative relocation")
    else:
        target, where = slot, [(slot_off, 8)]
        how = f"{label}[0] (the pointer at {arr:#x})"
    if target in (0, 0xFFFFFFFFFFFFFFFF, -1):
        raise GuardUnsupported(f"{label}[0] at {arr:#x} holds {target:#x}")
    return target, how, where


@dataclass(frozen=True, slots=True)
class _EarlyHook:
    """A glibc executable without DT_PREINIT_ARRAY whose libraries' constructors may call back
    into it and fork (usdtpatch.analysis.forkexposure.constructor_route): the guard must be
    registered before them. Its DT_INIT_ARRAY's first word (already pointed at the init stub)
    becomes a DT_PREINIT_ARRAY of one word, which glibc's dynamic linker calls before every
    library's constructor: two new dynamic entries in spare DT_NULL slots, DT_INIT_ARRAY one
    word later and shorter. The init stub then returns (a `ret`), and DT_INIT (repointed, or
    added in a third spare slot) runs a stub that calls the original DT_INIT, then the
    original first init array function: every original initializer runs in its original
    order. No relocation is added: the word keeps the relocation that fills it."""

    array: int  # DT_INIT_ARRAY's value
    edits: tuple[tuple[int, bytes], ...]  # the dynamic section's edits but DT_INIT's value
    init: int | None  # the original DT_INIT function (None: none)
    init_at: int  # file offset of the d_val that receives the new DT_INIT function

    @staticmethod
    def plan(image: ElfImage, dyn_entries: list[tuple[int, int, int]], how: str
             ) -> _EarlyHook | None:
        route = constructor_route(image)
        if route is None:
            return None
        why = f"{route}; the guard must be registered before that"
        if not how.startswith("DT_INIT_ARRAY[0]"):
            raise GuardUnsupported(f"{why}, and the file has no DT_INIT_ARRAY to give a "
                                   f"preinit function")
        tags = {t: (v, o) for t, v, o in dyn_entries}
        arr, arr_off = tags[DT_INIT_ARRAY]
        size, size_off = tags[DT_INIT_ARRAYSZ]
        init = tags.get(DT_INIT)
        first, spare = spare_dynamic_slots(image)
        need = 2 if init is not None else 3
        if spare < need:
            raise GuardUnsupported(
                f"{why}, and its dynamic section has {spare} spare DT_NULL slot(s) for the "
                f"{need} entries of a preinit array (the guard's first init array entry runs "
                f"after the libraries' constructors)")
        edits = [(first, struct.pack("<qQ", DT_PREINIT_ARRAY, arr)),
                 (first + 16, struct.pack("<qQ", DT_PREINIT_ARRAYSZ, 8)),
                 (arr_off + 8, struct.pack("<Q", arr + 8)),
                 (size_off + 8, struct.pack("<Q", size - 8))]
        if init is None:
            edits.append((first + 32, struct.pack("<q", DT_INIT)))
            init_at = first + 40
        else:
            init_at = init[1] + 8
        return _EarlyHook(arr, tuple(edits), init[0] if init else None, init_at)

    def first_stub(self, e: _Asm, first: int) -> None:
        """At e.pc, the new DT_INIT function: the original DT_INIT, then the original first
        init array function, each with the (argc, argv, envp) glibc passes."""
        if self.init:
            e.raw(PUSH_ARGS)
            e.call(self.init)
            e.raw(POP_ARGS)
        e.jmp(first)

    def patches(self, stub: int) -> tuple[tuple[int, bytes], ...]:
        return (*self.edits, (self.init_at, struct.pack("<Q", stub)))

    def describe(self, how: str) -> str:
        return (f"{how.replace('DT_INIT_ARRAY[0]', 'DT_PREINIT_ARRAY[0]', 1)}, a preinit "
                f"array added (its word is DT_INIT_ARRAY's first, now at {self.array + 8:#x}; "
                f"{'DT_INIT' if self.init else 'an added DT_INIT'} runs the original first "
                f"init function), before the libraries' constructors")


def _static_init(image: ElfImage) -> tuple[int, str, list[tuple[int, int]]]:
    """The hook of a static (non-PIE) glibc executable: its .preinit_array's first pointer
    when it has one (run first: before _init and .init_array), else its .init_array's."""
    for name in (".preinit_array", ".init_array"):
        sec = image.section(name)
        if sec is None or sec.size < 8:
            continue
        (target,) = struct.unpack_from("<Q", image.data, sec.offset)
        if target in (0, 0xFFFFFFFFFFFFFFFF):
            raise GuardUnsupported(f"{name}[0] holds {target:#x}")
        return target, f"{name}[0] (the pointer at {sec.addr:#x})", [(sec.offset, 8)]
    raise GuardUnsupported("static executable without .init_array to hook")


# --- code ----------------------------------------------------------------------------------

def _rel32(at_next: int, target: int) -> bytes:
    d = target - at_next
    if not -(1 << 31) <= d < (1 << 31):
        raise GuardUnsupported(f"{target:#x} is out of rel32 reach of {at_next:#x}")
    return struct.pack("<i", d)


class _Asm:
    """Just the handful of encodings the stubs need, each with its disassembly."""

    def __init__(self, address: int) -> None:
        self.address = address
        self.code = bytearray()

    @property
    def pc(self) -> int:
        return self.address + len(self.code)

    def raw(self, b: bytes) -> None:
        self.code += b

    def lea(self, reg: str, target: int) -> None:
        modrm = {"rdi": 0x3D, "rsi": 0x35, "rdx": 0x15, "rcx": 0x0D}[reg]
        op = bytes([0x48, 0x8D, modrm])  # lea disp32(%rip),%reg
        self.code += op + _rel32(self.pc + 7, target)

    def jmp(self, target: int) -> None:
        self.code += b"\xe9" + _rel32(self.pc + 5, target)  # jmp rel32

    def call(self, target: int) -> None:
        self.code += b"\xe8" + _rel32(self.pc + 5, target)  # call rel32


PUSH_ARGS = bytes([0x57, 0x56, 0x52])  # push %rdi; push %rsi; push %rdx (argc, argv, envp)
POP_ARGS = bytes([0x5A, 0x5E, 0x5F])  # pop %rdx; pop %rsi; pop %rdi
MOV_RDX_RDI = bytes([0x48, 0x89, 0xD7])  # mov %rdx,%rdi
XOR_EDX = bytes([0x31, 0xD2])  # xor %edx,%edx
XOR_EDI = bytes([0x31, 0xFF])  # xor %edi,%edi
XOR_ESI = bytes([0x31, 0xF6])  # xor %esi,%esi
XOR_ECX = bytes([0x31, 0xC9])  # xor %ecx,%ecx


def _init_stub(init: int, child: int, code: int, register_atfork: int | None, dso: int | None,
               then: int) -> bytes:
    """The code at `init`: register the child stub as an atfork child handler (through the
    guard's own REGISTER, or the static C library's __register_atfork), then jump to
    `then`, the argument registers as they came."""
    b = _Asm(init)
    b.raw(PUSH_ARGS)
    if register_atfork is None:
        b.raw(MOV_RDX_RDI)  # envp
        b.lea("rsi", child)
        if dso is None:
            b.raw(XOR_EDX)
        else:
            b.lea("rdx", dso)
        b.call(code + _code.REGISTER)
    else:
        b.raw(XOR_EDI + XOR_ESI)  # no prepare, no parent handler
        b.lea("rdx", child)
        b.raw(XOR_ECX)  # dso handle: an executable is never unloaded
        b.call(register_atfork)
    b.raw(POP_ARGS)
    b.jmp(then)
    return bytes(b.code)


def _interposed_how(interposed: dict[str, list[int]]) -> str:
    """The report's words for the interposed GOT slots."""
    how = "; the GOT slots of " + ", ".join(f"{n}()" for n, v in interposed.items() if v) \
        + " interposed (a child that does not share the address space re-arms its sites)"
    looked = [n for n, v in interposed.items() if n not in LOOKUPS]
    if any(n in interposed for n in LOOKUPS):
        how += "; what they return for " + ", ".join(f"{n}()" for n in looked) + \
            " is the guard's stub"
    return how


def build_guard(image: ElfImage, sites: tuple[tuple[int, bytes], ...] | list[tuple[int, bytes]],
                place_at: int) -> GuardBuild:
    """The fork guard of a rewritten file for `sites` ((vaddr, bytes) of every 5-byte NOP the
    kernel will optimize in the output), its code placed at `place_at` in the new segment.

    Sites a 6.18 kernel never optimizes (other lengths, crossing a page) are left out; with
    none left the result is empty (no code, no edit). Raises GuardUnsupported when the object
    cannot register the guard."""
    if image.machine != EM_X86_64 or not image.is64 or not image.little_endian:
        raise GuardUnsupported("the fork guard is x86-64 code")
    todo = guarded_sites(sites)
    if not todo:
        return GuardBuild(address=place_at, text=b"", patches=(), sites=(), table=0, symbols=(),
                          hook="no site needs it")
    if place_at % 16:
        raise GuardUnsupported(f"place_at {place_at:#x} is not 16-byte aligned")
    kind = _kind(image)
    if kind == "other":
        raise GuardUnsupported("only executables and shared objects load")
    dyn_entries = _dynamic(image)
    relas = _relas(image, {t: v for t, v, _o in dyn_entries})
    register_atfork: int | None = None
    bypass = _bypassing(image, kind)
    if kind == "static":
        register_atfork = _symbol(image, "__register_atfork")
        if register_atfork is None or bypass:
            # no registration point, or system calls that would not run the handlers: hook
            # the fork system calls themselves
            return _syscall_guard(image, todo, place_at)
    libc = c_library(image) if kind != "static" else "glibc"
    if libc not in ("glibc", "musl"):
        raise GuardUnsupported(f"it runs with {libc}: the guard knows how glibc and musl "
                               f"fork")
    if libc == "musl":
        _musl_problem(image, kind)
    interposed = interposed_routes(image, libc, kind) if dyn_entries else {}
    if interposed.get("syscall"):
        # a call of syscall() (or its address read) goes through its GOT slot: the stub
        bypass = [(pc, what) for pc, what in bypass if _is_syscall_insn(image, pc)]
    if kind != "static" and bypass:
        at, what = bypass[0]
        more = f" (and {len(bypass) - 1} more)" if len(bypass) > 1 else ""
        raise GuardUnsupported(
            f"its code may fork without the C library's fork(), whose atfork handlers the "
            f"guard registers with: {what}{f' at {at:#x}' if at else ''}{more}")
    if dyn_entries:
        target, how, where = _find_hook(image, dyn_entries, relas,
                                        preinit=libc == "glibc" and kind != "shared")
    else:
        target, how, where = _static_init(image)
    early = _EarlyHook.plan(image, dyn_entries, how) if dyn_entries else None
    dso: int | None = None
    if kind == "shared":
        dso = _dso_handle(image, relas)

    child = place_at + CHILD_STUB
    init = place_at + INIT_STUB
    code = place_at + CODE_AT
    block = _code.CODE if interposed else _code.CODE[:_code.BASE_END]
    table = code + len(block)
    table = (table + 3) & ~3
    table_end = table + ENTRY_SIZE * len(todo)

    a = _Asm(child)
    a.lea("rdi", table)
    a.lea("rsi", table_end)
    a.jmp(code + _code.REARM)
    stub_child = bytes(a.code)

    tail = (table_end + 15) & ~15
    first = target  # the original first init function
    if early is not None:
        target = place_at + CODE_AT - 1  # run as the preinit function: a `ret` after it
    stub_init = _init_stub(init, child, code, register_atfork, dso,
                           then=tail if interposed else target)
    assert len(stub_child) <= INIT_STUB - CHILD_STUB and len(stub_init) < CODE_AT - INIT_STUB

    text = bytearray(b"\xcc" * (table_end - place_at))
    text[CHILD_STUB: CHILD_STUB + len(stub_child)] = stub_child
    assert len(stub_child) <= INIT_STUB - len(GUARD_MARK)
    text[INIT_STUB - len(GUARD_MARK): INIT_STUB] = GUARD_MARK
    text[INIT_STUB: INIT_STUB + len(stub_init)] = stub_init
    text[CODE_AT: CODE_AT + len(block)] = block
    _write_table(text, place_at, table, todo)
    extra: list[tuple[str, int, int]] = []
    if interposed:
        t = _Asm(tail)
        extra = _interposition(t, image, interposed, child, target, code)
        text += b"\xcc" * (tail - place_at - len(text)) + t.code
    patches = tuple((off, struct.pack("<Q", init)) for off, _w in where)
    if early is not None:
        text[CODE_AT - 1] = 0xC3  # ret
        text += b"\xcc" * (-len(text) % 16)
        e = _Asm(place_at + len(text))
        early.first_stub(e, first)
        text += e.code
        extra.append(("__usdtpatch_fork_init_first", e.address, len(e.code)))
        patches += early.patches(e.address)
        how = early.describe(how)
    symbols = (("__usdtpatch_fork_child", child, len(stub_child)),
               ("__usdtpatch_fork_init", init, len(stub_init)),
               ("__usdtpatch_fork_rearm", code + _code.REARM, _code.REARM_END - _code.REARM),
               ("__usdtpatch_fork_register", code + _code.REGISTER,
                _code.BASE_END - _code.REGISTER), *extra)
    if interposed:
        how += _interposed_how(interposed)
    # the syscall() stub compares the number with the fork ones at run time: what check
    # reported as `fork-unknown` (a call of syscall() not fixed in the code) is covered
    return GuardBuild(address=place_at, text=bytes(text), patches=patches,
                      sites=tuple(a for a, _ in todo), table=table, symbols=symbols, hook=how,
                      checked=len(interposed.get("syscall", ())))


# --- a dynamically linked executable: the routes that skip the atfork handlers -----------

# the C library's functions whose child does not run the atfork handlers, interposed in the
# file's own GOT: _Fork (glibc 2.34+), clone (a child without CLONE_VM), syscall (fork, or
# clone / clone3 without CLONE_VM). fork() runs the handlers; vfork, posix_spawn, system and
# popen share the address space until exec.
INTERPOSED = ("_Fork", "clone", "syscall")
# the run-time lookups (analysis/forkexposure.py's LOOKUPS), interposed when the file imports
# them: a pointer they return to one of the interposed functions (or to themselves) is replaced
# by the guard's stub
IPO_SIZE = 24
IPO_RESOLVER = 1  # rearm.c: the entry of dlsym, which finds what the link map does not give


def interposed_routes(image: ElfImage, libc: str = "glibc", kind: str = "exe"
                      ) -> dict[str, list[int]]:
    """{name: its GOT slots (JUMP_SLOT / GLOB_DAT r_offset)} of the INTERPOSED functions the
    dynamically linked file (an executable or a shared object) imports (with musl, whose fork
    runs no handler the guard can register, fork too). syscall() only where a reference to
    it may fork (usdtpatch.analysis.hazards.fork_evidence: a call with a fork number or one
    not fixed in the code, or its address taken): a file whose every call names a number
    that is no fork (libstdc++'s futex calls) keeps its direct calls.

    When the file imports dlsym or dlvsym (LOOKUPS), their slots come first and every
    interposed function is listed, with an empty list where the file has no slot of it: its
    stub is reached only through the interposed lookup, which returns it in place of the real
    function (`dlsym(RTLD_DEFAULT, "_Fork")`)."""
    names = (*INTERPOSED, "fork") if libc == "musl" else INTERPOSED
    out: dict[str, list[int]] = {}
    for name in LOOKUPS:
        slots = import_slots(image, name)
        if slots:
            out[name] = slots
    for name in names:
        slots = import_slots(image, name)
        if slots and name == "syscall":
            ev = _evidence(image, kind != "shared")
            if not any(not _is_syscall_insn(image, pc) for pc, _w in (*ev.forks, *ev.unknown)):
                slots = []
        if slots or out:
            out[name] = slots
    if not any(out.values()):
        return {}
    return out


# functions of musl that fork inside the C library (their fork is not the file's GOT's)
MUSL_INNER_FORKS = ("daemon", "forkpty")


def _musl_problem(image: ElfImage, kind: str) -> None:
    """Raise GuardUnsupported when a musl process running `image` may fork where the guard
    cannot see it: musl has no __register_atfork to find without an import, so the guard is
    the file's own GOT slots of fork, _Fork, clone and syscall; a fork made by a shared
    object (a library the executable loads, or any process loading a shared object) or
    inside musl (daemon, forkpty) goes around them."""
    why = "musl's fork runs no handler the guard can register (no __register_atfork)"
    if kind == "shared":
        raise GuardUnsupported(f"shared object for musl: {why}, and a fork of the process "
                               "loading it does not go through this object's GOT")
    inner = sorted(n for n in MUSL_INNER_FORKS if import_slots(image, n))
    if inner:
        raise GuardUnsupported(f"it runs with musl and calls {', '.join(inner)}, which forks "
                               f"inside the C library: {why}")
    others = _libraries_that_may_fork(image)
    if others is not None:
        raise GuardUnsupported(f"it runs with musl and {others.removeprefix('it ')}: {why}")


def _is_syscall_insn(image: ElfImage, pc: int) -> bool:
    return bool(pc) and image.read_vaddr(pc, 2) == b"\x0f\x05"


def _relro(image: ElfImage, vaddr: int) -> bool:
    return any(sg.type == PT_GNU_RELRO and sg.vaddr <= vaddr < sg.vaddr + sg.memsz
               for sg in image.segments)


_PROT_R, _PROT_RW = 1, 3


def _route_stub(t: _Asm, name: str, via_real: Callable[[str, bytes], None],
                child_all: int) -> int:
    """At t.pc (aligned to 16): the stub of one fork route (`syscall`, `clone`, `_Fork`, musl's
    `fork`), which reads the real function from its word through `via_real`; a child it
    makes calls `child_all`. Returns the stub's address."""
    while t.pc % 16:
        t.raw(b"\xcc")
    at = t.pc
    j = _Jumps(t)
    if name == "syscall":
        t.raw(b"\x48\x83\xff" + bytes([SYS_FORK]))  # cmp $57,%rdi
        j.jcc(_JE, "fork")
        t.raw(b"\x48\x83\xff" + bytes([SYS_CLONE]))  # cmp $56,%rdi
        j.jcc(_JNE, "not_clone")
        t.raw(b"\xf7\xc6" + struct.pack("<I", _CLONE_VM))  # test $CLONE_VM,%esi
        j.jcc(_JE, "fork")
        j.jcc(_JNE, "plain")
        j.place("not_clone")
        t.raw(b"\x48\x81\xff" + struct.pack("<I", SYS_CLONE3))  # cmp $435,%rdi
        j.jcc(_JNE, "plain")
        t.raw(b"\x48\x85\xf6")  # test %rsi,%rsi (clone_args)
        j.jcc(_JE, "plain")
        t.raw(b"\x48\x83\xfa\x08")  # cmp $8,%rdx (its size)
        j.jcc(_JB, "plain")
        t.raw(b"\xf7\x06" + struct.pack("<I", _CLONE_VM))  # testl $CLONE_VM,(%rsi)
        j.jcc(_JE, "fork")
        j.place("plain")
        via_real(name, b"\xff\x25")  # jmp *real(%rip): every argument as it came
        j.place("fork")
    if name == "clone":
        # clone(fn, stack, flags, arg, ...): without CLONE_VM the child starts at `start`
        # below with {fn, arg} at the top of its stack, re-arms, then runs fn(arg)
        t.raw(b"\xf7\xc2" + struct.pack("<I", _CLONE_VM))  # test $CLONE_VM,%edx
        j.jcc(_JNE, "plain")
        t.raw(b"\x48\x85\xff")  # test %rdi,%rdi
        j.jcc(_JE, "plain")
        t.raw(b"\x48\x85\xf6")  # test %rsi,%rsi
        j.jcc(_JE, "plain")
        t.raw(b"\x48\x83\xe6\xf0")  # and $-16,%rsi
        t.raw(b"\x48\x83\xee\x10")  # sub $16,%rsi
        t.raw(b"\x48\x89\x3e")  # mov %rdi,(%rsi)
        t.raw(b"\x48\x89\x4e\x08")  # mov %rcx,8(%rsi)
        t.raw(b"\x48\x89\xf1")  # mov %rsi,%rcx
        lea_start = len(t.code)
        t.lea("rdi", t.pc)  # fixed below
        j.place("plain")
        via_real(name, b"\xff\x25")  # jmp *real(%rip)
        begin = t.pc
        t.code[lea_start + 3:lea_start + 7] = _rel32(t.address + lea_start + 7, begin)
        t.raw(b"\x57")  # push %rdi
        t.call(child_all)
        t.raw(b"\x5f")  # pop %rdi
        t.raw(b"\x48\x8b\x07")  # mov (%rdi),%rax
        t.raw(b"\x48\x8b\x7f\x08")  # mov 8(%rdi),%rdi
        t.raw(b"\xff\xe0")  # jmp *%rax
        return at
    # _Fork, or syscall() of a fork: call it, re-arm in the child
    t.raw(b"\x48\x83\xec\x08")  # sub $8,%rsp
    via_real(name, b"\xff\x15")  # call *real(%rip)
    t.raw(b"\x48\x85\xc0")  # test %rax,%rax
    j.jcc(_JNE, "done")
    t.call(child_all)
    t.raw(b"\x31\xc0")  # xor %eax,%eax
    j.place("done")
    t.raw(b"\x48\x83\xc4\x08\xc3")  # add $8,%rsp; ret
    return at


def _interposition(t: _Asm, image: ElfImage, routes: dict[str, list[int]], child: int,
                   target: int, code: int) -> list[tuple[str, int, int]]:
    """At t.pc: the init tail (usdtpatch_interpose(envp, table, end), then the original init
    function), one stub per route, the words the real functions go in, the interposition
    table and the names. Returns the symbols. A route without a slot (reached through an
    interposed lookup only) has one table entry whose slot is 0."""
    n_slots = sum(max(1, len(v)) for v in routes.values())
    start = t.pc
    t.raw(PUSH_ARGS)
    t.raw(MOV_RDX_RDI)
    lea_table = len(t.code)
    t.lea("rsi", t.pc)  # fixed below
    lea_end = len(t.code)
    t.lea("rdx", t.pc)
    lea_rd = len(t.code)
    t.lea("rcx", t.pc)
    t.call(code + _code.INTERPOSE)
    t.raw(POP_ARGS)
    t.jmp(target)
    tail_end = t.pc
    # a child made through a stub re-arms the sites of every rewritten object the link map
    # lists (usdtpatch_rearm_all), this one's included
    child_all = t.pc
    lea_rd_all = len(t.code)
    t.lea("rdi", t.pc)  # fixed below
    t.lea("rsi", child)
    t.jmp(code + _code.REARM_ALL)
    # the stubs, each reading the real function from its word (placed after them)
    stubs: dict[str, int] = {}
    real_reads: list[tuple[str, int]] = []  # (name, offset of the rel32 of a *real(%rip))
    stub_fixes: list[tuple[int, str]] = []  # (address of a lea stub(%rip),%rax, its route)

    def via_real(name: str, op: bytes) -> None:
        t.raw(op + b"\0\0\0\0")
        real_reads.append((name, len(t.code)))

    for name in [n for n in routes if n not in LOOKUPS]:
        stubs[name] = _route_stub(t, name, via_real, child_all)
    for name in [n for n in routes if n in LOOKUPS]:
        # dlsym / dlvsym: the real lookup (called, so that it sees this file as its caller),
        # then a result that is one of the interposed functions becomes its stub
        while t.pc % 16:
            t.raw(b"\xcc")
        stubs[name] = t.pc
        t.raw(b"\x48\x83\xec\x08")  # sub $8,%rsp
        via_real(name, b"\xff\x15")  # call *real(%rip)
        t.raw(b"\x48\x83\xc4\x08")  # add $8,%rsp
        t.raw(b"\x48\x85\xc0")  # test %rax,%rax
        assert 17 * len(routes) < 128
        t.raw(b"\x74" + bytes([17 * len(routes)]))  # je (the ret at the end)
        for other in routes:
            via_real(other, b"\x48\x3b\x05")  # cmp real(%rip),%rax
            t.raw(b"\x75\x08")  # jne (the next cmp)
            lea = t.pc
            t.raw(b"\x48\x8d\x05" + b"\0\0\0\0")  # lea stub(%rip),%rax
            stub_fixes.append((lea, other))
            t.raw(b"\xc3")  # ret
        t.raw(b"\xc3")  # ret
    for lea, other in stub_fixes:
        at = lea - t.address
        t.code[at + 3:at + 7] = _rel32(lea + 7, stubs[other])
    while t.pc % 8:
        t.raw(b"\xcc")
    real: dict[str, int] = {}
    for name in routes:
        real[name] = t.pc
        t.raw(b"\0" * 8)
    rd_word = t.pc  # _r_debug's address, written by usdtpatch_interpose
    t.raw(b"\0" * 8)
    for at in (lea_rd, lea_rd_all):
        t.code[at + 3:at + 7] = _rel32(t.address + at + 7, rd_word)
    for name, end in real_reads:
        t.code[end - 4:end] = _rel32(t.address + end, real[name])
    table = t.pc
    names_at = table + IPO_SIZE * n_slots
    names: dict[str, int] = {}
    at = names_at
    for name in routes:
        names[name] = at
        at += len(name) + 1
    for name, slots in routes.items():
        entries: list[int | None] = [*slots] or [None]  # None: the real word only, no slot
        for slot in entries:
            e = t.pc
            prot = _PROT_R if slot is not None and _relro(image, slot) else _PROT_RW
            t.raw(struct.pack("<iiiiii", 0 if slot is None else slot - e, real[name] - e,
                              stubs[name] - e, names[name] - e, prot,
                              IPO_RESOLVER if name == "dlsym" else 0))
    for name in routes:
        t.raw(name.encode() + b"\0")
    t.code[lea_table + 3:lea_table + 7] = _rel32(t.address + lea_table + 7, table)
    t.code[lea_end + 3:lea_end + 7] = _rel32(t.address + lea_end + 7, names_at)
    syms = [("__usdtpatch_fork_init_tail", start, tail_end - start),
            ("__usdtpatch_fork_child_all", child_all, 19),
            ("__usdtpatch_fork_interpose", code + _code.INTERPOSE,
             len(_code.CODE) - _code.INTERPOSE)]  # (poke() is before it)
    syms += [(f"__usdtpatch_fork_{n.strip('_').lower()}_stub", a, 0) for n, a in stubs.items()]
    return syms


# --- a static executable without __register_atfork: the fork system calls hooked -----------

SYSCALL_HOOK_WINDOW = 7  # mov $N,%eax (b8 imm32) + syscall (0f 05)
_CHILD_CALL = GUARD_ENTER + bytes([  # lea -0x80(%rsp),%rsp: past the red zone
    0x50, 0x51, 0x52, 0x56, 0x57,  # push %rax, %rcx, %rdx, %rsi, %rdi
    0x41, 0x50, 0x41, 0x51, 0x41, 0x52, 0x41, 0x53,  # push %r8 .. %r11
    0x9C,  # pushfq
    0x55, 0x48, 0x89, 0xE5,  # push %rbp; mov %rsp,%rbp
    0x48, 0x83, 0xE4, 0xF0,  # and $-16,%rsp
])
_CHILD_RETURN = bytes([
    0x48, 0x89, 0xEC, 0x5D,  # mov %rbp,%rsp; pop %rbp
    0x9D,  # popfq
    0x41, 0x5B, 0x41, 0x5A, 0x41, 0x59, 0x41, 0x58,  # pop %r11 .. %r8
    0x5F, 0x5E, 0x5A, 0x59, 0x58,  # pop %rdi, %rsi, %rdx, %rcx, %rax
    0x48, 0x8D, 0xA4, 0x24, 0x80, 0x00, 0x00, 0x00,  # lea 0x80(%rsp),%rsp
])


class Hook(NamedTuple):
    """A system call's hook: the window [start, start + length) the `jmp` to the hook takes,
    the `syscall`'s address in it (`at`: its end, or its start), the number the window's
    `mov` sets (None: compared at run time) and, for a window from the `syscall` on that ends
    with a direct `jmp`, that jump's target."""

    start: int
    length: int
    number: int | None
    at: int
    jump: int | None = None
    jump_size: int = 0  # the size of that `jmp` (rel8 or rel32), the window's last bytes


def fork_syscall_hooks(image: ElfImage) -> list[Hook] | str:
    """The hook (Hook) of each system call of a
    static executable that the guard hooks (usdtpatch.analysis.hazards.fork_evidence), or why
    one cannot be hooked:

    - a fork (or clone without CLONE_VM): `mov $N,%eax; syscall`, the number known;
    - a `syscall` whose number the code does not fix (None: the hook compares %eax with the
      fork numbers at run time): the whole instructions right before it (at least 3 bytes,
      none rip-relative or a branch) and the `syscall`.

    No way in may land inside a window (its function's targets and the file-wide ways in); a
    call of syscall() is not a `syscall` instruction and cannot be hooked."""

    ev = _evidence(image, True)
    todo = [(pc, what, True) for pc, what in ev.forks] + \
        [(pc, what, False) for pc, what in ev.unknown]
    if not todo:
        return "no fork system call was found to hook"
    try:
        cfi = load_cfi(image)
    except CfiError:
        cfi = CfiIndex(image, (), (), "none")
    ctx = CodeContext(image, cfi, load_symbols(image))
    wrapper = _symbol(image, "syscall")
    wb = ctx.bounds(wrapper) if wrapper is not None else None
    if wb is not None:
        # calls of (or references to) the C library's syscall(): its own system call is
        # hooked, the number compared at run time, whoever calls it
        calls = [t for t in todo if image.read_vaddr(t[0], 2) != b"\x0f\x05"]
        if calls:
            raw = bytes(image.read_vaddr(wb.start, wb.size))
            inside = [wb.start + i for i in range(len(raw) - 1) if raw[i:i + 2] == b"\x0f\x05"]
            todo = [t for t in todo if t not in calls] + \
                [(pc, "the system call of syscall()", False) for pc in inside]
    spans = [(pc, b.start, b.end) for pc, _w, _k in todo if (b := ctx.bounds(pc)) is not None]
    ctx.ways_in = file_ways_in(ctx, spans, sorted({*cfi.starts, *ctx.symbols.addresses}))
    out: list[Hook] = []
    for pc, what, known in todo:
        got = _hook_window(ctx, image, pc, what, known)
        if isinstance(got, str):
            return got
        out.append(got)
    return out


def _hook_window(ctx: CodeContext, image: ElfImage, pc: int, what: str, known: bool
                 ) -> Hook | str:
    """fork_syscall_hooks' window for the system call at `pc`, or why there is none: the
    window before it (`_before_window`), else the one from it on (`_after_window`)."""

    where = (f"{what} system call at {pc:#x}" if known else
             f"system call at {pc:#x} ({what})" if pc else what)
    bounds = ctx.bounds(pc) if pc else None
    if bounds is None or image.read_vaddr(pc, 2) != b"\x0f\x05":
        return f"the {where} is not a syscall instruction of a known function"
    fc = ctx.function(bounds)
    k = fc.index_of(pc)
    if fc.all_targets is not None or k is None:
        return f"the {where} is reached other than by falling into it"
    got = _before_window(image, fc, bounds, pc, k, where, known)
    if not isinstance(got, str):
        return got
    after = _after_window(image, fc, bounds, pc, k, where)
    if not isinstance(after, str):
        return after
    return f"{got} (nor from it on: {after.removeprefix(f'the {where} ')})"


def _after_window(image: ElfImage, fc: FunctionCode, bounds: FunctionBounds, pc: int, k: int,
                  where: str) -> Hook | str:
    """The window that starts at the `syscall` (a way in to the `syscall` itself lands on the
    hook's jump): it and the whole instructions after it up to 5 bytes at least, none
    rip-relative and none a branch but a direct `jmp`, which ends it (the hook jumps to its
    target). The number is compared at run time."""
    end = pc + 2
    j = k + 1
    while end - pc < 5:
        ins = fc.insns[j] if j < len(fc.insns) else None
        if ins is None or not bounds.contains(ins.address):
            return f"the {where} has too few bytes after it in its function to hook"
        if ins.rip_target is not None or ins.flow not in (Flow.NONE, Flow.JMP) or \
                (ins.flow is Flow.JMP and ins.target is None):
            return (f"the {where} is followed by {ins.text} at {ins.address:#x}, which cannot "
                    f"be moved to the hook")
        end = ins.address + ins.size
        j += 1
        if ins.flow is Flow.JMP:
            break
    if end - pc < 5:
        return f"the {where} has too few bytes after it in its function to hook"
    if fc.targets_between(pc, end):
        return f"the {where} is followed by code reached other than by falling into it"
    debug = window_debug_refusal(image, pc, end)
    if debug is not None:
        return f"the {where}: {debug[1]}"
    last = fc.insns[j - 1]
    if last.flow is Flow.JMP:
        return Hook(pc, end - pc, None, pc, last.target, last.size)
    return Hook(pc, end - pc, None, pc)


def _before_window(image: ElfImage, fc: FunctionCode, bounds: FunctionBounds, pc: int, k: int,
                   where: str, known: bool) -> Hook | str:
    """The window that ends with the `syscall`: `mov $N,%eax` before it (a fork number), or
    the whole instructions before it, at least 3 bytes, none rip-relative or a branch."""
    if known:
        start = pc - 5
        raw = bytes(image.read_vaddr(start, SYSCALL_HOOK_WINDOW))
        if raw[:1] != b"\xb8" or fc.index_of(start) is None or not bounds.contains(start):
            return f"the {where} is not `mov $N,%eax; syscall`"
        number: int | None = int.from_bytes(raw[1:5], "little")
    else:
        j = k
        while j > 0 and pc - fc.insns[j].address < 3:
            j -= 1
            ins = fc.insns[j]
            if ins.flow is not Flow.NONE or ins.rip_target is not None:
                return (f"the {where} follows {ins.text} at {ins.address:#x}, which cannot "
                        f"be moved to the hook")
        start, number = fc.insns[j].address, None
        if pc - start < 3:
            return f"the {where} has too few bytes before it in its function to hook"
    if fc.targets_between(start, pc + 2):
        return f"the {where} is reached other than by falling into it"
    debug = window_debug_refusal(image, start, pc + 2)  # the rows inside move, or it says
    if debug is not None:
        return f"the {where}: {debug[1]}"
    return Hook(start, pc + 2 - start, number, pc)


def _syscall_guard(image: ElfImage, todo: tuple[tuple[int, bytes], ...],
                   place_at: int) -> GuardBuild:
    """The guard of a static executable without `__register_atfork`: each fork system call
    (fork_syscall_hooks) jumps to a copy that makes the call and, in the child (%rax 0),
    calls the child stub with every register the code after it may read kept."""
    hooks = fork_syscall_hooks(image)
    if isinstance(hooks, str):
        raise GuardUnsupported(f"static executable of {c_library(image)} whose fork system "
                               f"calls must be hooked "
                               f"(its symbol table does not name __register_atfork, or its "
                               f"code may fork without fork()), and {hooks}")
    child = place_at + CHILD_STUB
    code = place_at + CODE_AT
    table = (code + _code.BASE_END + 3) & ~3
    table_end = table + ENTRY_SIZE * len(todo)
    a = _Asm(child)
    a.lea("rdi", table)
    a.lea("rsi", table_end)
    a.jmp(code + _code.REARM)
    stub_child = bytes(a.code)
    h = _Asm((table_end + 15) & ~15)
    patches: list[tuple[int, bytes]] = []
    for hook in hooks:
        at = h.pc
        _hook(h, image, hook, child)
        off = image.vaddr_to_offset(hook.start)
        if off is None:
            raise GuardUnsupported(f"the system call at {hook.at:#x} is not in the file")
        patches.append((off, b"\xe9" + _rel32(hook.start + 5, at) + b"\xcc" * (hook.length - 5)))
    text = bytearray(b"\xcc" * (h.pc - place_at))
    text[CHILD_STUB: CHILD_STUB + len(stub_child)] = stub_child
    text[CODE_AT: CODE_AT + _code.BASE_END] = _code.CODE[:_code.BASE_END]
    _write_table(text, place_at, table, todo)
    text[h.address - place_at:] = h.code
    checked = sum(1 for k in hooks if k.number is None)
    # a system call of unknown number is not named a fork one: it may be any
    how = ("the " + ("" if checked else "fork ") + "system call" + ("s" if len(hooks) > 1 else "")
           + " at "
           + ", ".join(f"{k.at:#x}" for k in hooks)
           + " (hooked" + (f"; {checked} of them compare their number with the fork ones at "
                           "run time" if checked else "") + ")")
    symbols = (("__usdtpatch_fork_child", child, len(stub_child)),
               ("__usdtpatch_fork_rearm", code + _code.REARM, _code.REARM_END - _code.REARM),
               ("__usdtpatch_fork_hooks", h.address, len(h.code)))
    return GuardBuild(address=place_at, text=bytes(text), patches=tuple(patches),
                      sites=tuple(a for a, _ in todo), table=table, symbols=symbols, hook=how,
                      checked=checked,
                      hooked=tuple((k.start, k.start + k.length) for k in hooks))


_LEA_DOWN = GUARD_ENTER  # lea -0x80(%rsp),%rsp
_LEA_UP = GUARD_LEAVE  # lea 0x80(%rsp),%rsp
_PUSHF, _POPF, _SYSCALL = b"\x9c", b"\x9d", b"\x0f\x05"
SYS_FORK, SYS_CLONE, SYS_CLONE3 = 57, 56, 435
_CLONE_VM = 0x100
_TEST_EDI_VM = b"\xf7\xc7" + struct.pack("<I", _CLONE_VM)  # test $CLONE_VM,%edi
_TEST_RDI = b"\x48\x85\xff"  # test %rdi,%rdi
_CMP_RSI_8 = b"\x48\x83\xfe\x08"  # cmp $8,%rsi
_TESTL_RDI_VM = b"\xf7\x07" + struct.pack("<I", _CLONE_VM)  # testl $CLONE_VM,(%rdi)


def _cmp_eax(n: int) -> bytes:
    return b"\x3d" + struct.pack("<I", n)  # cmp $n,%eax (the kernel reads %eax)


class _Jumps:
    """Forward conditional jumps (jcc rel32) to labels placed later."""

    def __init__(self, h: _Asm) -> None:
        self.h = h
        self.pending: dict[str, list[int]] = {}

    def jcc(self, cc: int, label: str) -> None:
        self.h.raw(bytes([0x0F, cc]) + b"\0\0\0\0")
        self.pending.setdefault(label, []).append(len(self.h.code))

    def place(self, label: str) -> None:
        for end in self.pending.pop(label, []):
            self.h.code[end - 4:end] = _rel32(self.h.address + end, self.h.pc)


_JE, _JNE, _JB = 0x84, 0x85, 0x82


def _hook(h: _Asm, image: ElfImage, hook: Hook, child: int) -> None:
    """One hook at h.pc for the window [start, start + length) (its last 2 bytes the
    `syscall`): the system call made as in the window, and, in the child of a fork, the child
    stub called with every register the code after it may read kept.

    Whether the call creates a child that does not share the address space is decided in the
    parent, before the system call, from the registers the kernel reads (the number in %eax;
    clone's flags in %rdi; clone3's in the first word of the struct %rdi points at, %rsi its
    size): fork; clone without CLONE_VM; clone3 without CLONE_VM. Any other call (a thread, a
    `clone(fn, stack, CLONE_VM|...)` on a stack of a few bytes, vfork, any other number) goes
    through a `syscall` of its own after which nothing runs but the jump back: the hook never
    touches the memory of a child that shares its parent's."""
    start, length, number = hook.start, hook.length, hook.number
    back = start + length
    after = b""  # the instructions after the syscall a window from it on moves
    if hook.at == start:
        after = bytes(image.read_vaddr(start + 2, length - 2 - hook.jump_size))
    elif number is not None:
        h.raw(b"\xb8" + struct.pack("<I", number))  # mov $N,%eax
    else:
        h.raw(bytes(image.read_vaddr(start, length - 2)))  # the instructions before it

    def leave() -> None:
        h.raw(after)
        h.jmp(hook.jump if hook.jump is not None else back)
    j = _Jumps(h)
    h.raw(_LEA_DOWN + _PUSHF)  # (the flags the syscall would keep are kept)
    h.raw(_cmp_eax(SYS_FORK))
    j.jcc(_JE, "fork")
    h.raw(_cmp_eax(SYS_CLONE))
    j.jcc(_JNE, "not_clone")
    h.raw(_TEST_EDI_VM)
    j.jcc(_JE, "fork")  # clone without CLONE_VM
    j.jcc(_JNE, "plain")
    j.place("not_clone")
    h.raw(_cmp_eax(SYS_CLONE3))
    j.jcc(_JNE, "plain")
    # clone3(args, size): the kernel refuses a null or short struct (no child); the flags
    # are read in the parent, before the call
    h.raw(_TEST_RDI)
    j.jcc(_JE, "plain")
    h.raw(_CMP_RSI_8)
    j.jcc(_JB, "plain")
    h.raw(_TESTL_RDI_VM)
    j.jcc(_JE, "fork")
    j.place("plain")
    h.raw(_POPF + _LEA_UP + _SYSCALL)  # no copied address space: the system call as it was
    leave()
    j.place("fork")
    h.raw(_POPF + _LEA_UP + _SYSCALL)
    h.raw(b"\x48\x85\xc0")  # test %rax,%rax
    j.jcc(_JNE, "cont")  # the parent, or an error
    h.raw(_CHILD_CALL)
    h.call(child)
    h.raw(_CHILD_RETURN)
    j.place("cont")
    leave()


def marker_entry(g: GuardBuild) -> dict[str, object]:
    """What the restore marker records of a guard (read back by `coverage`)."""
    return {"hook": g.hook, "table": [g.table, g.table + ENTRY_SIZE * len(g.sites)]}


# --- reading a guard back ------------------------------------------------------------------

def hook_problem(image: ElfImage) -> str | None:
    """Why `build_guard` would refuse `image` (None: a guard can be added)."""

    probe_at = (max((s.vaddr for s in image.segments if s.type == 1), default=0) + 0x10000)
    try:
        build_guard(image, ((probe_at, NOP5),), probe_at & ~0xF)
    except GuardUnsupported as exc:
        return str(exc)
    except (UsdtpatchError, struct.error, ValueError) as exc:
        return f"the file's dynamic section or symbols cannot be read: {exc}"
    return None


def _write_table(text: bytearray, place_at: int, table: int,
                 todo: Sequence[tuple[int, bytes]]) -> None:
    """The guard's site table into `text` (which starts at `place_at`): one entry per site
    at `table`, its rel32 to the site, then the bytes the child writes back."""
    for i, (addr, raw) in enumerate(todo):
        entry = table + i * ENTRY_SIZE
        rel = addr - entry
        if not -(1 << 31) <= rel < (1 << 31) or rel == 0:
            raise GuardUnsupported(f"site {addr:#x} is out of reach of the table")
        text[entry - place_at: entry - place_at + ENTRY_SIZE] = (
            struct.pack("<i", rel) + raw + b"\0\0\0")
