"""Where a stripped shared object keeps its `__dso_handle`, read from the code that uses it.

The fork guard registers its child handler with `__register_atfork(..., dso_handle)`, and
glibc drops the handler when the object is unloaded only if `dso_handle` is the object's own
`__dso_handle` (the word crtbeginS.o defines as `__dso_handle = &__dso_handle`: a word that an
R_X86_64_RELATIVE relocation points at itself). A stripped object has no symbol for it, and
it may have other self-pointing words (a list head that starts out pointing at itself), so the
word is identified by what the object's own code does with it:

- the `__cxa_finalize` witness: crtstuff's `__do_global_dtors_aux` (gcc's crtbeginS.o; the
  `__do_fini` of LLVM's crtbegin.o has the same call) runs from DT_FINI_ARRAY, or is called
  from the DT_FINI function, and calls `__cxa_finalize(__dso_handle)`:
  `mov __dso_handle(%rip),%rdi` then `call __cxa_finalize@plt` (or `call *slot(%rip)`, or
  `call *%reg` with the slot loaded into %reg). The callee is recognised by the GOT slot the
  dynamic linker fills with `__cxa_finalize` (its R_X86_64_GLOB_DAT / JUMP_SLOT relocation),
  which a PLT stub (`jmp *slot(%rip)`, after an optional endbr64 / bnd prefix) jumps through;
- the `__cxa_atexit` witness: a C++ constructor in DT_INIT_ARRAY registers a destructor with
  `__cxa_atexit(fn, obj, &__dso_handle)`: `lea __dso_handle(%rip),%rdx` (possibly through
  another register: `lea ...,%rbx; mov %rbx,%rdx`) before the call.

Each function is decoded from its entry, linearly, until its first `ret` or unconditional jump
past which no branch of it goes; the argument register's value is followed through
rip-relative `lea`/`mov` and register copies, forgotten at any other write, at a call, and at
every branch target. Every witness found must name the same word, and that word must point
at itself; otherwise there is no answer and the reason says why. Only a few hundred bytes are
decoded (the fini functions, and at most INIT_FUNCTIONS init functions of INIT_WINDOW bytes).
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

from usdtpatch.elf.image import ElfImage
from usdtpatch.elf.model import (
    DT_FINI,
    DT_FINI_ARRAY,
    DT_FINI_ARRAYSZ,
    DT_INIT_ARRAY,
    DT_INIT_ARRAYSZ,
    DT_RELR,
    DT_RELRSZ,
    R_X86_64_RELATIVE,
)
from usdtpatch.elf.relocs import RelaTable, import_slots
from usdtpatch.x86.decode import LiteInsn, disassemble_lite
from usdtpatch.x86.regs import CALLER_SAVED, CLOBBERS_MORE, READ_ONLY, reg64

FINI_WINDOW = 256  # crtstuff's __do_global_dtors_aux is about 60 bytes
INIT_WINDOW = 1024
INIT_FUNCTIONS = 16
FINI_FUNCTIONS = 8

_RIP = re.compile(r"^(-?0x[0-9a-f]+|-?\d+)\(%rip\)$")
class Witness(NamedTuple):
    """One call that passes the object's dso handle: `what` ("__cxa_finalize" or
    "__cxa_atexit"), the address of the call, and the word it names."""

    what: str
    call: int
    handle: int

    def __str__(self) -> str:
        return f"{self.what} at {self.call:#x} gets {self.handle:#x}"


class DsoHandle(NamedTuple):
    """The answer: `address` of __dso_handle, or None with `reason`; the witnesses seen."""

    address: int | None
    reason: str
    witnesses: tuple[Witness, ...]


def _reg(text: str) -> str | None:
    t = text.strip()
    return reg64(t) if t.startswith("%") else None


def _rip_target(ins: LiteInsn, operand: str) -> int | None:
    m = _RIP.match(operand.strip().lstrip("*"))
    if m is None:
        return None
    return ins.address + ins.size + int(m[1], 0)


def _operands(op_str: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in op_str:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


class _Code:
    """Reads functions of one image and resolves the targets of calls."""

    def __init__(self, image: ElfImage) -> None:
        self.image = image
        self._stub: dict[int, int | None] = {}

    def stub_slot(self, target: int) -> int | None:
        """The GOT slot a PLT stub at `target` jumps through (`[endbr64] [bnd] jmp
        *slot(%rip)`), or None."""
        if target in self._stub:
            return self._stub[target]
        raw = self.image.read_vaddr(target, 16)
        at = 4 if raw[:4] == b"\xf3\x0f\x1e\xfa" else 0
        at += 1 if raw[at:at + 1] == b"\xf2" else 0
        slot = None
        if raw[at:at + 2] == b"\xff\x25" and len(raw) >= at + 6:
            (disp,) = struct.unpack_from("<i", raw, at + 2)
            slot = target + at + 6 + disp
        self._stub[target] = slot
        return slot

    def function(self, start: int, window: int) -> list[LiteInsn]:
        """The instructions of the function at `start`: decoded linearly up to `window`
        bytes, ending at the first ret / unconditional jump that no branch seen so far goes
        past."""
        raw = self.image.read_vaddr(start, window)
        out: list[LiteInsn] = []
        reach = start
        for ins in map(LiteInsn._make, disassemble_lite(raw, start)):
            out.append(ins)
            m = ins.mnemonic
            if m.startswith("j") or m.startswith("loop"):
                t = _direct(ins)
                if t is not None and start <= t < start + window:
                    reach = max(reach, t)
            if (m.startswith(("ret", "hlt", "ud2")) or m in ("jmp", "jmpq")) \
                    and reach <= ins.address:
                break
        return out


def _direct(ins: LiteInsn) -> int | None:
    op = ins.op_str.strip()
    if op.startswith("0x") and "," not in op:
        return int(op, 16)
    return None


def _calls(code: _Code, insns: list[LiteInsn], slots: frozenset[int], reg: str,
           what: str) -> list[Witness]:
    """The calls (and tail jumps) in `insns` that go to the import filling `slots`, with the
    word `reg` names at each: the target of a rip-relative lea into it (a copy through other
    registers followed), or the place a rip-relative mov loads it from."""
    targets = {t for ins in insns if ins.mnemonic.startswith(("j", "loop"))
               for t in (_direct(ins),) if t is not None}
    values: dict[str, tuple[str, int]] = {}  # register -> ("addr" | "load", address)
    out: list[Witness] = []
    for ins in insns:
        if ins.address in targets:
            values.clear()  # another way in: what a register holds is not known here
        m, ops = ins.mnemonic, _operands(ins.op_str)
        if m.startswith(("call", "jmp")):
            slot: int | None = None
            if len(ops) == 1:
                direct = _direct(ins)
                if direct is not None:
                    slot = code.stub_slot(direct)
                elif ops[0].startswith("*%"):
                    held = values.get(_reg(ops[0][1:]) or "")
                    slot = held[1] if held and held[0] == "load" else None
                else:
                    slot = _rip_target(ins, ops[0])
            if slot is not None and slot in slots:
                held = values.get(reg)
                if held is not None:
                    out.append(Witness(what, ins.address, held[1]))
            if m.startswith("call"):
                for r in CALLER_SAVED:
                    values.pop(r, None)
            continue
        if m.startswith(("push", "j")):
            continue
        if m.startswith(CLOBBERS_MORE):
            values.clear()
            continue
        if m.startswith(READ_ONLY):
            continue
        if len(ops) == 2 and m in ("lea", "leaq", "mov", "movq"):
            dst = _reg(ops[1])
            if dst is not None and ops[1] == f"%{dst}":  # a 64-bit destination
                src_reg = _reg(ops[0])
                rip = _rip_target(ins, ops[0])
                if rip is not None:
                    values[dst] = ("addr" if m.startswith("lea") else "load", rip)
                elif src_reg is not None and src_reg in values and m.startswith("mov"):
                    values[dst] = values[src_reg]
                else:
                    values.pop(dst, None)
                continue
        if ops:
            dst = _reg(ops[-1])
            if dst is not None:
                values.pop(dst, None)
    return out


def _array(image: ElfImage, dyn: dict[int, int], relas: RelaTable, tag: int, size_tag: int,
           limit: int) -> list[int]:
    """The function pointers of DT_INIT_ARRAY / DT_FINI_ARRAY (at most `limit`): the addend
    of the relative relocation of each slot, or the word in the file (DT_RELR, non-PIC)."""
    at, size = dyn.get(tag), dyn.get(size_tag, 0)
    if at is None or size < 8:
        return []
    raw = image.read_vaddr(at, min(size, 8 * limit))
    out = [w for (w,) in struct.iter_unpack("<Q", raw[: len(raw) - len(raw) % 8])]
    for place, rtype, addend in relas.in_range(at, at + len(out) * 8):
        out[(place - at) // 8] = addend if rtype == R_X86_64_RELATIVE else 0
    return [p for p in out if p not in (0, 0xFFFFFFFFFFFFFFFF)]


def _self_pointing(image: ElfImage, dyn: dict[int, int], relas: RelaTable, at: int) -> bool:
    """Whether the word at `at` is relocated to hold its own address."""
    rels = relas.in_range(at, at + 8)
    if rels:
        return len(rels) == 1 and rels[0][1] == R_X86_64_RELATIVE and rels[0][2] == at
    word = image.read_vaddr(at, 8)
    if len(word) != 8 or struct.unpack("<Q", word)[0] != at:
        return False
    return _relr_covers(image, dyn, at)


def _relr_covers(image: ElfImage, dyn: dict[int, int], vaddr: int) -> bool:
    if DT_RELR not in dyn or not dyn.get(DT_RELRSZ):
        return False
    raw = image.read_vaddr(dyn[DT_RELR], dyn[DT_RELRSZ])
    where = 0
    for (word,) in struct.iter_unpack("<Q", raw[: len(raw) - len(raw) % 8]):
        if word & 1 == 0:
            if word == vaddr:
                return True
            where = word + 8
        else:
            if where <= vaddr < where + 63 * 8 and (vaddr - where) % 8 == 0 \
                    and word >> (1 + (vaddr - where) // 8) & 1:
                return True
            where += 63 * 8
    return False


def witnesses(image: ElfImage, dyn: dict[int, int], relas: RelaTable) -> tuple[Witness, ...]:
    """Every call passing a dso handle found in the fini and init functions."""
    code = _Code(image)
    out: list[Witness] = []
    finalize = frozenset(import_slots(image, "__cxa_finalize"))
    if finalize:
        starts = _array(image, dyn, relas, DT_FINI_ARRAY, DT_FINI_ARRAYSZ, FINI_FUNCTIONS)
        if dyn.get(DT_FINI):
            fini = code.function(dyn[DT_FINI], FINI_WINDOW)
            starts.append(dyn[DT_FINI])
            # an older crtstuff calls __do_global_dtors_aux from the .fini section
            starts += [t for ins in fini if ins.mnemonic.startswith("call")
                       for t in (_direct(ins),) if t is not None]
        seen: set[int] = set()
        for start in starts:
            if start in seen:
                continue
            seen.add(start)
            out += _calls(code, code.function(start, FINI_WINDOW), finalize, "rdi",
                          "__cxa_finalize")
    atexit = frozenset(import_slots(image, "__cxa_atexit"))
    if atexit:
        for start in dict.fromkeys(_array(image, dyn, relas, DT_INIT_ARRAY, DT_INIT_ARRAYSZ,
                                          INIT_FUNCTIONS)):
            out += _calls(code, code.function(start, INIT_WINDOW), atexit, "rdx",
                          "__cxa_atexit")
    return tuple(out)


def find_dso_handle(image: ElfImage, dyn: dict[int, int], relas: RelaTable) -> DsoHandle:
    """The address of `__dso_handle` in a shared object without its symbol (see the module's
    docstring), or None with the reason."""
    seen = witnesses(image, dyn, relas)
    handles = sorted({w.handle for w in seen})
    if not handles:
        return DsoHandle(None, "its symbol table is stripped and no code passes it to "
                         "__cxa_finalize (DT_FINI_ARRAY, DT_FINI) or __cxa_atexit "
                         "(DT_INIT_ARRAY)", seen)
    if len(handles) > 1:
        return DsoHandle(None, "the code names different words: "
                         + "; ".join(str(w) for w in seen), seen)
    (handle,) = handles
    if not _self_pointing(image, dyn, relas, handle):
        return DsoHandle(None, f"{seen[0]}, a word that does not point at itself (crtbeginS.o's "
                         f"__dso_handle does)", seen)
    return DsoHandle(handle, "; ".join(str(w) for w in seen), seen)
