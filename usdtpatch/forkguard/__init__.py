"""The fork guard: optimized sites must not crash a child forked while they are traced.

On Linux 6.18 the uprobe trampoline page is not copied by fork: a child inherits every site
its parent had optimized (`e8 rel32`, a call into the trampoline) but not the page the call
goes to, and dies with SIGSEGV at its first hit. The guard runs in every forked child (an
atfork child handler) and, for each site of its object whose bytes are such a call into a page
the child does not have, writes back the kernel's int3 state (`cc` + the site's bytes 1..4)
through /proc/self/mem. The next hit traps, the probe fires for the child, and the kernel
optimizes the site again in the child. docs/fork-guard.md has the whole story.

This package holds the guard's code (rearm.c, built by recipe.py into _code.py) and
`build_guard`, the rewriter's seam: the code, the site table and two stubs for the new
segment, and the in-place edits that make the object register the guard when it loads:

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
from collections.abc import Sequence
from dataclasses import dataclass

from usdtpatch.elf.image import (
    EM_X86_64,
    ET_DYN,
    ET_EXEC,
    PT_DYNAMIC,
    PT_INTERP,
    ElfImage,
)
from usdtpatch.elf.relocs import RelaTable
from usdtpatch.elf.symbols import symbol_value
from usdtpatch.errors import UnsupportedError, UsdtpatchError
from usdtpatch.forkguard import _code
from usdtpatch.x86.nops import crosses_page, kernel_optimizable_nop5

ENTRY_SIZE = 12
CHILD_STUB = 0
INIT_STUB = 32
CODE_AT = 80
TABLE_SECTION = "__usdtpatch_fork_sites"  # sys/sdt.h's table

DT_NULL = 0
DT_RELA = 7
DT_RELASZ = 8
DT_RELAENT = 9
DT_INIT = 12
DT_INIT_ARRAY = 25
DT_INIT_ARRAYSZ = 27
DT_RELRSZ = 35
DT_RELR = 36
DT_FLAGS_1 = 0x6FFFFFFB
DF_1_PIE = 0x08000000
R_X86_64_RELATIVE = 8


class GuardUnsupported(UnsupportedError):
    """The file cannot carry the fork guard; the message says why."""


@dataclass(frozen=True, slots=True)
class GuardBuild:
    """The guard for one rewritten file.

    `text` goes at `address` in the new segment; `patches` are in-place edits (file offset,
    new bytes); `symbols` are (name, address, size) for the output's symbol table; `hook`
    says in words how the object registers the guard.
    """

    address: int
    text: bytes
    patches: tuple[tuple[int, bytes], ...]
    sites: tuple[int, ...]
    table: int
    symbols: tuple[tuple[str, int, int], ...]
    hook: str

    @property
    def empty(self) -> bool:
        return not self.text


def guarded_sites(sites: tuple[tuple[int, bytes], ...] | list[tuple[int, bytes]]
                  ) -> tuple[tuple[int, bytes], ...]:
    """The sites a 6.18 kernel optimizes (a 5-byte NOP within one page): the ones to guard."""
    return tuple((a, bytes(b)) for a, b in sites
                 if len(b) == 5 and kernel_optimizable_nop5(b) and not crosses_page(a, 5))


def fork_exposure(image: ElfImage) -> str | None:
    """Why a process running `image` may fork a copy of itself (None: it cannot, as far as
    the file tells): it imports (a static file: defines) a call of the fork family that copies
    the address space, or it is a shared object (whatever process loads it may fork).

    vfork, posix_spawn, system and popen are not counted: their child runs in the parent's
    address space, trampoline included, until it execs. Where no symbol names a fork, the
    code is asked (usdtpatch.analysis.hazards.fork_evidence): a fork system call, or clone
    without CLONE_VM. A system call whose number the code does not fix is not counted here:
    check reports it (`fork-unknown`), and so does rewrite."""
    from usdtpatch.analysis.hazards import FORK_COPIES_MM, imported_fork_family

    calls = [f for f in imported_fork_family(image) if f in FORK_COPIES_MM]
    if not calls and _kind(image) == "static":
        # a static PIE also has a .dynsym (for its self-relocation): look at what it defines
        calls = sorted(f for f in FORK_COPIES_MM if _symbol(image, f) is not None)
    if calls:
        return f"it calls {', '.join(calls)}"
    if _kind(image) == "shared":
        return "it is a shared object (the process that loads it may fork)"
    if not any(f in FORK_COPIES_MM for f in imported_fork_family(image)):
        # no symbol names a fork (a stripped static executable, a raw system call): the code
        from usdtpatch.analysis.hazards import fork_evidence_of

        return fork_evidence_of(image).describe()
    return None


def is_shared(image: ElfImage) -> bool:
    """Whether `image` is a shared object (not an executable, static or dynamic)."""
    return _kind(image) == "shared"


def _kind(image: ElfImage) -> str:
    """"exe" (dynamically linked executable), "shared" (shared object), "static" (static
    executable, PIE or not) or "other"."""
    if image.type not in (ET_EXEC, ET_DYN):
        return "other"
    if any(s.type == PT_INTERP for s in image.segments):
        return "exe"
    dyn = _dynamic(image) if any(s.type == PT_DYNAMIC for s in image.segments) else []
    if not dyn:
        return "static"
    flags1 = next((v for t, v, _o in dyn if t == DT_FLAGS_1), 0)
    if image.type == ET_EXEC or flags1 & DF_1_PIE:
        return "static"  # a static PIE relocates itself: it has a .dynamic and no interpreter
    return "shared"


# --- reading the file --------------------------------------------------------------------

def _dynamic(image: ElfImage) -> list[tuple[int, int, int]]:
    """(tag, value, file offset of the entry) of PT_DYNAMIC, up to DT_NULL."""
    seg = next((s for s in image.segments if s.type == PT_DYNAMIC), None)
    if seg is None:
        return []
    out = []
    end = min(seg.offset + seg.filesz, len(image.data))
    for off in range(seg.offset, end - 15, 16):
        tag, val = struct.unpack_from("<qQ", image.data, off)
        if tag == DT_NULL:
            break
        out.append((tag, val, off))
    return out


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
    from usdtpatch.forkguard.dso import find_dso_handle  # only for a stripped object

    found = find_dso_handle(image, {t: v for t, v, _o in _dynamic(image)}, relas)
    if found.address is None:
        raise GuardUnsupported(f"shared object without a __dso_handle ({found.reason}): a "
                               "guard could not be unregistered when the object is unloaded")
    return found.address


def _find_hook(image: ElfImage, dyn_entries: list[tuple[int, int, int]],
               relas: RelaTable) -> tuple[int, str, list[tuple[int, int]]]:
    """(original init function, description, [(file offset, width)] to receive the stub's
    address) for the object's first init function."""
    dyn = {t: v for t, v, _o in dyn_entries}
    arr, arrsz = dyn.get(DT_INIT_ARRAY), dyn.get(DT_INIT_ARRAYSZ, 0)
    if arr is not None and arrsz >= 8:
        slot_off = _offset(image, arr, 8, "DT_INIT_ARRAY")
        (slot,) = struct.unpack_from("<Q", image.data, slot_off)
        rels = relas.at(arr)
        if len(rels) > 1:
            raise GuardUnsupported(f"DT_INIT_ARRAY[0] at {arr:#x} has {len(rels)} relocations")
        if rels:
            roff, rtype, addend = rels[0]
            if rtype != R_X86_64_RELATIVE:
                raise GuardUnsupported(f"DT_INIT_ARRAY[0] at {arr:#x} is filled by relocation "
                                       f"type {rtype}, not R_X86_64_RELATIVE")
            target = addend
            where = [(roff + 16, 8)]
            if slot == addend and slot:
                where.append((slot_off, 8))
            how = f"DT_INIT_ARRAY[0] (R_X86_64_RELATIVE addend at {arr:#x})"
        elif image.type == ET_DYN and _relr_covers(image, dyn, arr):
            target, where = slot, [(slot_off, 8)]
            how = f"DT_INIT_ARRAY[0] (the DT_RELR-relocated word at {arr:#x})"
        elif image.type == ET_DYN and slot:
            raise GuardUnsupported(f"DT_INIT_ARRAY[0] at {arr:#x} has no relative relocation")
        else:
            target, where = slot, [(slot_off, 8)]
            how = f"DT_INIT_ARRAY[0] (the pointer at {arr:#x})"
        if target in (0, 0xFFFFFFFFFFFFFFFF, -1):
            raise GuardUnsupported(f"DT_INIT_ARRAY[0] at {arr:#x} holds {target:#x}")
        return target, how, where
    init = next(((v, o) for t, v, o in dyn_entries if t == DT_INIT), None)
    if init is not None and init[0]:
        return init[0], "DT_INIT", [(init[1] + 8, 8)]
    raise GuardUnsupported("the file has neither DT_INIT_ARRAY nor DT_INIT to hook")


def _static_init(image: ElfImage) -> tuple[int, str, list[tuple[int, int]]]:
    """The hook of a static (non-PIE) executable: its .init_array's first pointer."""
    sec = image.section(".init_array")
    if sec is None or sec.size < 8:
        raise GuardUnsupported("static executable without .init_array to hook")
    (target,) = struct.unpack_from("<Q", image.data, sec.offset)
    if target in (0, 0xFFFFFFFFFFFFFFFF):
        raise GuardUnsupported(f".init_array[0] holds {target:#x}")
    return target, f".init_array[0] (the pointer at {sec.addr:#x})", [(sec.offset, 8)]


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
        return GuardBuild(place_at, b"", (), (), 0, (), "no site needs it")
    if place_at % 16:
        raise GuardUnsupported(f"place_at {place_at:#x} is not 16-byte aligned")
    kind = _kind(image)
    if kind == "other":
        raise GuardUnsupported("only executables and shared objects load")
    dyn_entries = _dynamic(image)
    relas = _relas(image, {t: v for t, v, _o in dyn_entries})
    register_atfork: int | None = None
    if kind == "static":
        register_atfork = _symbol(image, "__register_atfork")
        if register_atfork is None:
            # no registration point: hook the fork system calls themselves
            return _syscall_guard(image, todo, place_at)
    if dyn_entries:
        target, how, where = _find_hook(image, dyn_entries, relas)
    else:
        target, how, where = _static_init(image)
    dso: int | None = None
    if kind == "shared":
        dso = _dso_handle(image, relas)

    child = place_at + CHILD_STUB
    init = place_at + INIT_STUB
    code = place_at + CODE_AT
    table = code + len(_code.CODE)
    table = (table + 3) & ~3
    table_end = table + ENTRY_SIZE * len(todo)

    a = _Asm(child)
    a.lea("rdi", table)
    a.lea("rsi", table_end)
    a.jmp(code + _code.REARM)
    stub_child = bytes(a.code)

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
    b.jmp(target)
    stub_init = bytes(b.code)
    assert len(stub_child) <= INIT_STUB - CHILD_STUB and len(stub_init) <= CODE_AT - INIT_STUB

    text = bytearray(b"\xcc" * (table_end - place_at))
    text[CHILD_STUB: CHILD_STUB + len(stub_child)] = stub_child
    text[INIT_STUB: INIT_STUB + len(stub_init)] = stub_init
    text[CODE_AT: CODE_AT + len(_code.CODE)] = _code.CODE
    _write_table(text, place_at, table, todo)

    patches = tuple((off, struct.pack("<Q", init)) for off, _w in where)
    symbols = (("__usdtpatch_fork_child", child, len(stub_child)),
               ("__usdtpatch_fork_init", init, len(stub_init)),
               ("__usdtpatch_fork_rearm", code + _code.REARM, _code.REARM_END - _code.REARM),
               ("__usdtpatch_fork_register", code + _code.REGISTER,
                len(_code.CODE) - _code.REGISTER))
    return GuardBuild(place_at, bytes(text), patches, tuple(a for a, _ in todo), table,
                      symbols, how)


# --- a static executable without __register_atfork: the fork system calls hooked -----------

SYSCALL_HOOK_WINDOW = 7  # mov $N,%eax (b8 imm32) + syscall (0f 05)
_CHILD_CALL = bytes([
    0x48, 0x8D, 0x64, 0x24, 0x80,  # lea -0x80(%rsp),%rsp: past the red zone
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


def fork_syscall_hooks(image: ElfImage) -> list[tuple[int, int]] | str:
    """(window start, system call number) of each fork system call of a static executable
    that the guard can hook (usdtpatch.analysis.hazards.fork_evidence: fork, or clone without
    CLONE_VM): `mov $N,%eax` right before the `syscall`, the `syscall` reached only from it
    (no branch target there, no way in from the whole file), or why one cannot be hooked."""
    from usdtpatch.analysis.hazards import fork_evidence
    from usdtpatch.analysis.targets import CodeContext
    from usdtpatch.analysis.waysin import build_ways_in
    from usdtpatch.elf.cfi import CfiError, CfiIndex, load_cfi
    from usdtpatch.elf.symbols import load_symbols

    try:
        cfi = load_cfi(image)
    except CfiError:
        cfi = CfiIndex(image, (), (), "none")
    ctx = CodeContext(image, cfi, load_symbols(image))
    ev = fork_evidence(ctx)
    if not ev.forks:  # (system calls of a number the code does not fix: fork-unknown)
        return "no fork system call was found to hook"
    out: list[tuple[int, int]] = []
    for pc, what in ev.forks:
        start = pc - 5
        raw = bytes(image.read_vaddr(start, SYSCALL_HOOK_WINDOW))
        bounds = ctx.bounds(pc)
        if len(raw) != SYSCALL_HOOK_WINDOW or raw[0] != 0xB8 or raw[5:] != b"\x0f\x05" \
                or bounds is None or not bounds.contains(start):
            return f"the {what} system call at {pc:#x} is not `mov $N,%eax; syscall`"
        ctx.ways_in = build_ways_in(image, [(pc, bounds.start, bounds.end)],
                                    sorted({*cfi.starts, *ctx.symbols.addresses}), cfi)
        fc = ctx.function(bounds)
        if fc.all_targets is not None or fc.is_target(pc) or fc.index_of(start) is None:
            return f"the {what} system call at {pc:#x} is reached other than from its mov"
        out.append((start, int.from_bytes(raw[1:5], "little")))
    return out


def _syscall_guard(image: ElfImage, todo: tuple[tuple[int, bytes], ...],
                   place_at: int) -> GuardBuild:
    """The guard of a static executable without `__register_atfork`: each fork system call
    (fork_syscall_hooks) jumps to a copy that makes the call and, in the child (%rax 0),
    calls the child stub with every register the code after it may read kept."""
    hooks = fork_syscall_hooks(image)
    if isinstance(hooks, str):
        raise GuardUnsupported(f"static executable whose symbol table does not name "
                               f"__register_atfork (stripped, or fork handlers not linked), "
                               f"and {hooks}")
    child = place_at + CHILD_STUB
    code = place_at + CODE_AT
    table = (code + len(_code.CODE) + 3) & ~3
    table_end = table + ENTRY_SIZE * len(todo)
    a = _Asm(child)
    a.lea("rdi", table)
    a.lea("rsi", table_end)
    a.jmp(code + _code.REARM)
    stub_child = bytes(a.code)
    h = _Asm((table_end + 15) & ~15)
    patches: list[tuple[int, bytes]] = []
    starts: list[int] = []
    for start, number in hooks:
        at = h.pc
        starts.append(at)
        back = start + SYSCALL_HOOK_WINDOW
        h.raw(b"\xb8" + struct.pack("<I", number) + b"\x0f\x05")  # the system call itself
        h.raw(b"\x48\x85\xc0")  # test %rax,%rax
        h.raw(b"\x0f\x85" + _rel32(h.pc + 6, at + 0))  # placeholder, fixed below
        jnz_at = len(h.code) - 6
        h.raw(_CHILD_CALL)
        h.call(child)
        h.raw(_CHILD_RETURN)
        cont = h.pc
        h.code[jnz_at + 2: jnz_at + 6] = _rel32(h.address + jnz_at + 6, cont)
        h.jmp(back)
        off = image.vaddr_to_offset(start)
        if off is None:
            raise GuardUnsupported(f"the fork system call at {start:#x} is not in the file")
        patches.append((off, b"\xe9" + _rel32(start + 5, at) + b"\xcc\xcc"))
    text = bytearray(b"\xcc" * (h.pc - place_at))
    text[CHILD_STUB: CHILD_STUB + len(stub_child)] = stub_child
    text[CODE_AT: CODE_AT + len(_code.CODE)] = _code.CODE
    _write_table(text, place_at, table, todo)
    text[h.address - place_at:] = h.code
    how = ("the fork system call" + ("s" if len(hooks) > 1 else "") + " at "
           + ", ".join(f"{s + 5:#x}" for s, _n in hooks)
           + " (hooked: no __register_atfork to register with)")
    symbols = (("__usdtpatch_fork_child", child, len(stub_child)),
               ("__usdtpatch_fork_rearm", code + _code.REARM, _code.REARM_END - _code.REARM),
               ("__usdtpatch_fork_hooks", h.address, len(h.code)))
    return GuardBuild(place_at, bytes(text), tuple(patches), tuple(a for a, _ in todo), table,
                      symbols, how)


def marker_entry(g: GuardBuild) -> dict[str, object]:
    """What the restore marker records of a guard (read back by `coverage`)."""
    return {"hook": g.hook, "table": [g.table, g.table + ENTRY_SIZE * len(g.sites)]}


# --- reading a guard back ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TableEntry:
    entry: int  # the entry's address
    site: int
    orig: bytes


def read_table(image: ElfImage, start: int, end: int) -> tuple[TableEntry, ...]:
    """The entries of a site table in [start, end) (empty entries left out)."""
    raw = image.read_vaddr(start, end - start)
    if len(raw) != end - start or (end - start) % ENTRY_SIZE:
        raise GuardUnsupported(f"site table [{start:#x}, {end:#x}) is not in the file")
    out = []
    for i in range(0, len(raw), ENTRY_SIZE):
        (rel,) = struct.unpack_from("<i", raw, i)
        if rel:
            out.append(TableEntry(start + i, start + i + rel, raw[i + 4: i + 9]))
    return tuple(out)


def header_table(image: ElfImage) -> tuple[TableEntry, ...] | None:
    """The fork-guard table sys/sdt.h left in a file (None: the file has none)."""
    sec = image.section(TABLE_SECTION)
    if sec is None or not sec.allocated:
        return None
    return read_table(image, sec.addr, sec.addr + sec.size)


@dataclass(frozen=True, slots=True)
class Coverage:
    """The fork guard a file carries: which of its sites it covers and how it registers."""

    kind: str  # "sdt.h" (built with usdtpatch's header) or "rewrite" (added by rewrite)
    sites: frozenset[int]
    how: str


def coverage(image: ElfImage) -> Coverage | None:
    """The fork guard of `image`, or None when it has none (or it cannot be read)."""
    try:
        return _coverage(image)
    except (UsdtpatchError, struct.error, ValueError):
        return None


def _coverage(image: ElfImage) -> Coverage | None:
    table = header_table(image)
    if table is not None:
        return Coverage("sdt.h", frozenset(e.site for e in table),
                        "sys/sdt.h's constructor registers it with pthread_atfork")
    from usdtpatch.elf.marker import marker_of

    try:
        marker = marker_of(image)
    except UnsupportedError:
        return None
    fg = marker.get("fork_guard") if marker is not None else None
    if not isinstance(fg, dict):
        return None
    span = fg.get("table")
    hook = fg.get("hook")
    if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span)):
        return None
    try:
        entries = read_table(image, span[0], span[1])
    except GuardUnsupported:
        return None
    return Coverage("rewrite", frozenset(e.site for e in entries),
                    f"usdtpatch rewrite added it ({hook})")


def hook_problem(image: ElfImage) -> str | None:
    """Why `build_guard` would refuse `image` (None: a guard can be added)."""
    from usdtpatch.x86.nops import NOP5

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
