"""x86-64 code lifted to VEX IR, as plain tuples. The only module that imports pyvex.

`lift_block(code, address)` lifts the instructions of `code` (which starts at `address`) up
to the first branch or the end of `code`, and gives a `Block`: the statements and the next
address as tuples of plain values, so that `usdtpatch.prove.smt` executes them without
knowing pyvex. What the prover does not model is refused here with `NotLiftable`: a dirty
helper call (rdtsc, cpuid, x87 state, ...), indexed guest state (the x87 register stack), a
system call or trap, a load-linked pair, a double-width compare-and-swap, and an instruction
VEX cannot decode.

Expressions:  ("c", value, bits) | ("t", tmp) | ("g", offset, bits) | ("ld", addr, bits)
              | ("op", name, args, bits, arg_bits) | ("ite", cond, if_true, if_false)
              | ("cc", helper name, args, bits)
Statements:   ("im", address, length) | ("wr", tmp, expr) | ("put", offset, expr)
              | ("st", addr, expr, bits) | ("exit", guard, target, jumpkind)
              | ("cas", old tmp, addr, expected, new, bits)
              | ("ldg", tmp, addr, alt, guard, convert op or None, load bits)
              | ("stg", addr, expr, guard, bits)
Every "bits" is the width of the value (1 for VEX's Ity_I1).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import pyvex

_ARCH: Any = pyvex.ARCH_AMD64
_TYPE_SIZE: Any = pyvex.const.get_type_size  # untyped in pyvex
Expr = tuple[Any, ...]
Stmt = tuple[Any, ...]

# jump kinds that are ordinary control flow; any other (a syscall, a trap, no decode) is not
# modelled
_PLAIN_JUMPS = frozenset({"Ijk_Boring", "Ijk_Call", "Ijk_Ret"})
# conditional exits that are a fault of the instruction (movdqa's alignment check): a path
# that takes one ends there, at that instruction
FAULTS = frozenset({"Ijk_SigSEGV", "Ijk_SigBUS"})
_TRAPS = frozenset({"Ijk_NoDecode", "Ijk_SigTRAP", "Ijk_SigILL"})


class NotLiftable(Exception):
    """The code holds something the prover does not model; the message says what."""


class Undecodable(NotLiftable):
    """The instruction at the address faults when run: it does not decode (SIGILL) or it is
    int3 or ud2 (SIGTRAP, SIGILL)."""


@dataclass(frozen=True, slots=True)
class Block:
    """One lifted block: statements, then control goes to `next` (an expression) with
    `jumpkind` ("Ijk_Boring", "Ijk_Call", "Ijk_Ret")."""

    address: int
    size: int
    stmts: tuple[Stmt, ...]
    next: Expr
    jumpkind: str
    insns: tuple[int, ...]  # the addresses of its instructions


def register_offset(name: str) -> int:
    """VEX's guest-state offset of an amd64 register ("rax", "ymm0", "cc_op")."""
    return int(_ARCH.get_register_offset(name))


def _bits(ty: str) -> int:
    return int(_TYPE_SIZE(ty))


class _Converter:
    def __init__(self, irsb: Any) -> None:
        self.tyenv = irsb.tyenv

    def expr(self, e: Any) -> Expr:
        kind = type(e).__name__
        if kind == "RdTmp":
            return ("t", e.tmp)
        if kind == "Const":
            ty = str(e.con.type)
            if ty in ("Ity_F64", "Ity_F32"):  # a float constant: its bits
                fmt = "<d" if ty == "Ity_F64" else "<f"
                raw = struct.pack(fmt, float(e.con.value))
                return ("c", int.from_bytes(raw, "little"), _bits(ty))
            return ("c", int(e.con.value), _bits(ty))
        if kind == "Get":
            return ("g", int(e.offset), _bits(e.ty))
        if kind == "Load":
            if e.end != "Iend_LE":
                raise NotLiftable("a big-endian load")
            return ("ld", self.expr(e.addr), _bits(e.ty))
        if kind in ("Unop", "Binop", "Triop", "Qop"):
            args = tuple(self.expr(a) for a in e.args)
            arg_bits = tuple(_bits(a.result_type(self.tyenv)) for a in e.args)
            return ("op", str(e.op), args, _bits(e.result_type(self.tyenv)), arg_bits)
        if kind == "ITE":
            return ("ite", self.expr(e.cond), self.expr(e.iftrue), self.expr(e.iffalse))
        if kind == "CCall":
            return ("cc", str(e.cee.name), tuple(self.expr(a) for a in e.args),
                    _bits(e.retty))
        raise NotLiftable(f"VEX expression {kind} is not modelled")

    def stmt(self, s: Any) -> Stmt | None:
        kind = type(s).__name__
        if kind == "IMark":
            return ("im", int(s.addr) + int(s.delta), int(s.len))
        if kind == "WrTmp":
            return ("wr", s.tmp, self.expr(s.data))
        if kind == "Put":
            return ("put", int(s.offset), self.expr(s.data))
        if kind == "Store":
            if s.end != "Iend_LE":
                raise NotLiftable("a big-endian store")
            return ("st", self.expr(s.addr), self.expr(s.data),
                    _bits(s.data.result_type(self.tyenv)))
        if kind == "Exit":
            if s.jk not in _PLAIN_JUMPS and s.jk not in FAULTS:
                raise NotLiftable(f"a conditional {s.jk[4:]} exit")
            return ("exit", self.expr(s.guard), int(s.dst.value), str(s.jk))
        if kind == "CAS":
            if s.oldHi not in (None, 0xFFFFFFFF) or s.dataHi is not None:
                raise NotLiftable("a double-width compare-and-swap")
            data = self.expr(s.dataLo)
            return ("cas", s.oldLo, self.expr(s.addr), self.expr(s.expdLo), data,
                    _bits(s.dataLo.result_type(self.tyenv)))
        if kind == "LoadG":
            cvt = None if str(s.cvt).startswith("ILGop_Ident") else str(s.cvt)
            return ("ldg", s.dst, self.expr(s.addr), self.expr(s.alt), self.expr(s.guard),
                    cvt, _bits(s.cvt_types[0]))
        if kind == "StoreG":
            return ("stg", self.expr(s.addr), self.expr(s.data), self.expr(s.guard),
                    _bits(s.data.result_type(self.tyenv)))
        if kind in ("NoOp", "AbiHint", "MBE"):
            return None
        if kind == "Dirty":
            raise NotLiftable(f"the helper call {s.cee.name} (rdtsc, cpuid, x87 state and "
                              f"the like)")
        if kind == "PutI":
            raise NotLiftable("indexed guest state (the x87 register stack)")
        raise NotLiftable(f"VEX statement {kind} is not modelled")


def lift_block(code: bytes, address: int) -> Block:
    """The block of `code` (at `address`) from its first byte; NotLiftable when it holds
    something the prover does not model."""
    if not code:
        raise NotLiftable(f"no code at {address:#x}")
    try:
        irsb = pyvex.lift(code, address, _ARCH, opt_level=1, cross_insn_opt=False)
    except pyvex.PyVEXError as exc:
        raise NotLiftable(f"VEX cannot lift the code at {address:#x}: {exc}") from exc
    statements = list(irsb.statements)
    jumpkind = str(irsb.jumpkind)
    if jumpkind in _TRAPS:
        # the block's last instruction (the one at `next` for NoDecode, int3 for SigTRAP)
        # faults: keep the instructions before it, then on to it (an Undecodable block)
        marks = [i for i, st in enumerate(statements) if type(st).__name__ == "IMark"]
        if jumpkind == "Ijk_NoDecode" and type(irsb.next).__name__ == "Const":
            bad = int(irsb.next.con.value)
            cut = next((i for i in marks if int(statements[i].addr) == bad), len(statements))
        else:
            cut = marks[-1] if marks else 0
            bad = int(statements[cut].addr) if marks else address
        if cut == 0 or not marks or cut == marks[0]:
            raise Undecodable(f"the instruction at {bad:#x} faults ({jumpkind[4:]})")
        statements = statements[:cut]
        jumpkind = "Ijk_Boring"
        next_expr: Expr = ("c", bad, 64)
    elif jumpkind not in _PLAIN_JUMPS:
        raise NotLiftable(f"the code at {address:#x} ends in {jumpkind[4:]} (a system "
                          f"call or an instruction VEX does not model)")
    else:
        next_expr = ()
    conv = _Converter(irsb)
    stmts = []
    for s in statements:
        out = conv.stmt(s)
        if out is not None:
            stmts.append(out)
    insns = tuple(st[1] for st in stmts if st[0] == "im")
    if not insns:
        raise NotLiftable(f"VEX lifted no instruction at {address:#x}")
    defs = {st[1]: st[2] for st in stmts if st[0] == "wr"}
    # a locked instruction's restart when its compare-and-swap fails never happens in one
    # thread (the compared value was just loaded): not a loop
    targets = [st[2] for st in stmts if st[0] == "exit" and st[3] not in FAULTS and not (
        st[1][0] == "t" and defs.get(st[1][1], ("",))[0] == "op"
        and str(defs[st[1][1]][1]).startswith("Iop_CasCmpNE"))]
    nxt = next_expr if next_expr else conv.expr(irsb.next)
    if nxt[0] == "c":
        targets.append(nxt[1])
    if any(t in insns for t in targets):
        raise NotLiftable(f"the code at {address:#x} loops (a rep-prefixed string instruction "
                          f"or a loop: its length is not known)")
    return Block(address=address, size=int(irsb.size), stmts=tuple(stmts), next=nxt,
                 jumpkind=jumpkind, insns=insns)
