"""Symbolic execution of lifted code, and the equivalence query. The only module that imports
z3-solver.

Both sides (the window and the detour) start from one shared symbolic state: every 8 bytes
of VEX's guest state are a 64-bit variable (the status flags one more, as VEX's COPY thunk),
memory is an uninterpreted function `m0` from address to byte. A side's memory is `m0` and the
list of bytes it wrote, in order: a load of a byte is the newest write whose address equals
it (an if-then-else chain; an address that is a register plus a constant is decided without
the solver against another such address of the same register), else `m0` of it. No z3 array
is built (they made the query take seconds).

Integer operations are modelled bit for bit; every other pure VEX operation (floating
point, most vector operations, the flag helpers) is an uninterpreted function of its
operands: both sides applying it to equal operands get equal results, which is all an
equivalence needs (a difference the solver finds through such a function is only a
candidate: the prover replays it in the emulator before calling the detour wrong). Division
is refused (its query does not finish in the budget).

`run(...)` gives every path of one side from one entry: its condition, the guest state at
the exit, the bytes written, the memory accesses grouped by (original) instruction, the
registers at each probe hit, and the exit address. `differences(a, b, ...)` lists what may
differ between two paths; `solve(...)` asks z3, under a deterministic resource limit.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3
from z3 import z3 as _z3_module  # its main context (fresh_context)
from z3.z3 import _to_expr_ref as _ref  # a term z3's C API made, its reference held

from usdtpatch.prove.vex import FAULTS, Block, NotLiftable, Undecodable, lift_block

Z = Any  # z3 expressions (the binding is untyped)

RSP = 48
RIP = 184
CC_OP, CC_DEP1, CC_DEP2, CC_NDEP = 144, 152, 160, 168
GPRS = (("rax", 16), ("rcx", 24), ("rdx", 32), ("rbx", 40), ("rsp", 48), ("rbp", 56),
        ("rsi", 64), ("rdi", 72), *((f"r{i}", 16 + 8 * i) for i in range(8, 16)))
YMM0 = 224  # ymm0..ymm15, 32 bytes each
STATUS_FLAGS = 0x8D5  # CF PF AF ZF SF OF
# guest state not compared at the exit: rip (the exit is compared instead), the flag thunk
# (the flags it describes are), VEX's emulation notes and the syscall pseudo-registers
_NOT_STATE = (range(184, 192), range(144, 176), range(992, 1032), range(1040, 1048))
FAULT = "fault"  # a path's jumpkind when it ends in a fault (its exit: the instruction's)
MEMORY = "the memory byte at"
ACCESSES = ("the memory accessed at", "the instructions that access memory")
TRAMPOLINE_BYTES = 32  # 6.18's optimized hit: call (8) + push rcx, r11, rax (24) below rsp


# Terms made through z3's C API directly: the same terms, in the same order, as z3's Python
# operators make for operands of one sort (what every call below has), without their
# checks and coercions (several C calls each: most of a proof's time was spent in them).
# tests/test_prove_terms.py holds each to the operator it replaces.
_BitVecRef: Any = z3.BitVecRef
_BoolRef: Any = z3.BoolRef
_BitVecNumRef: Any = z3.BitVecNumRef
_Ast: Any = z3.Ast


def mk_ite(c: Z, t: Z, f: Z) -> Z:
    """z3.If(c, t, f) of a Boolean and two bit-vectors of one size."""
    ctx = t.ctx
    r = ctx.ref()
    e = z3.Z3_mk_ite(r, c.as_ast(), t.as_ast(), f.as_ast())
    return (_BitVecNumRef if z3.Z3_is_numeral_ast(r, e) else _BitVecRef)(e, ctx)


def mk_eq(a: Z, b: Z) -> Z:
    """a == b, both of one sort (as Python evaluates it: a right operand of a subclass of
    the left's type, a numeral's BitVecNumRef against a BitVecRef, is asked first, and
    the term is then (= b a))."""
    if type(b) is not type(a) and isinstance(b, type(a)):
        a, b = b, a
    ctx = a.ctx
    return _BoolRef(z3.Z3_mk_eq(ctx.ref(), a.as_ast(), b.as_ast()), ctx)


def mk_extract(hi: int, lo: int, v: Z) -> Z:
    """z3.Extract(hi, lo, v) of a bit-vector."""
    ctx = v.ctx
    return _BitVecRef(z3.Z3_mk_extract(ctx.ref(), hi, lo, v.as_ast()), ctx)


def mk_concat(parts: Sequence[Z]) -> Z:
    """z3.Concat(*parts) of bit-vectors (two or more): made pair by pair as z3 makes it."""
    ctx = parts[0].ctx
    c = ctx.ref()
    r = parts[0]
    for p in parts[1:]:
        r = _BitVecRef(z3.Z3_mk_concat(c, r.as_ast(), p.as_ast()), ctx)
    return r


def mk_app1(f: Z, a: Z) -> Z:
    """f(a), `a` of f's domain."""
    ctx = a.ctx
    args = (_Ast * 1)()
    args[0] = a.as_ast()
    return _ref(z3.Z3_mk_app(ctx.ref(), f.ast, 1, args), ctx)


def mk_app(f: Z, terms: Sequence[Z]) -> Z:
    """f(*terms), each of its domain's sort."""
    if not terms:
        return f()
    ctx = terms[0].ctx
    args = (_Ast * len(terms))()
    for i, t in enumerate(terms):
        args[i] = t.as_ast()
    return _ref(z3.Z3_mk_app(ctx.ref(), f.ast, len(terms), args), ctx)


def _mk_nary(mk: Any, terms: Sequence[Z]) -> Z:
    ctx = terms[0].ctx
    args = (_Ast * len(terms))()
    for i, t in enumerate(terms):
        args[i] = t.as_ast()
    return _BoolRef(mk(ctx.ref(), len(terms), args), ctx)


def mk_and(*terms: Z) -> Z:
    """z3.And of Boolean terms (at least one)."""
    return _mk_nary(z3.Z3_mk_and, terms)


def mk_or(*terms: Z) -> Z:
    """z3.Or of Boolean terms (at least one)."""
    return _mk_nary(z3.Z3_mk_or, terms)


def mk_val(k: int, like: Z) -> Z:
    """The numeral `k` of `like`'s sort, made anew as z3's operators make a Python int
    operand (z3.BitVecVal: not the kept bv_const)."""
    ctx = like.ctx
    c = ctx.ref()
    return _BitVecNumRef(z3.Z3_mk_numeral(c, str(k), z3.Z3_get_sort(c, like.as_ast())), ctx)


def mk_bin(mk: Any, a: Z, b: Z) -> Z:
    ctx = a.ctx
    return _BitVecRef(mk(ctx.ref(), a.as_ast(), b.as_ast()), ctx)


def mk_cmp(mk: Any, a: Z, b: Z) -> Z:
    ctx = a.ctx
    return _BoolRef(mk(ctx.ref(), a.as_ast(), b.as_ast()), ctx)


def is_op(e: Z, kind: int) -> bool:
    """z3.is_app_of(e, kind) of a term (z3.is_true: Z3_OP_TRUE, z3.is_false: Z3_OP_FALSE)."""
    if not isinstance(e, z3.ExprRef):
        return False
    c, a = e.ctx.ref(), e.as_ast()
    return z3.Z3_get_ast_kind(c, a) in (z3.Z3_APP_AST, z3.Z3_NUMERAL_AST) and \
        z3.Z3_get_decl_kind(c, z3.Z3_get_app_decl(c, a)) == kind


def is_true_term(e: Z) -> bool:
    return is_op(e, z3.Z3_OP_TRUE)


def is_false_term(e: Z) -> bool:
    return is_op(e, z3.Z3_OP_FALSE)


def same_term(a: Z, b: Z) -> bool:
    """a.eq(b): the same term."""
    return bool(z3.Z3_is_eq_ast(a.ctx.ref(), a.as_ast(), b.as_ast()))


def bits_of(e: Z) -> int:
    """e.size() of a bit-vector."""
    ctx = e.ctx.ref()
    return int(z3.Z3_get_bv_sort_size(ctx, z3.Z3_get_sort(ctx, e.as_ast())))


def _numeral(e: Z) -> bool:
    """z3.is_bv_value(e) of a bit-vector term."""
    return bool(z3.Z3_is_numeral_ast(e.ctx.ref(), e.as_ast()))


class Unprovable(Exception):
    """Outside what the prover models (or the path/step limits); the message says what."""


@contextlib.contextmanager
def fresh_context() -> Iterator[None]:
    """Every term made inside made anew, in a z3 context of its own (z3.main_ctx swapped;
    the kept terms of _bv, _var, _wide and the witness states set aside): what z3 answers
    then depends on the question alone, not on the terms the process made before (z3
    orders a sum's or a conjunction's operands by their ids, and a model follows the
    order). Nothing made inside may be used after."""
    old = _z3_module._main_ctx
    _forget()
    _z3_module._main_ctx = z3.Context()
    try:
        yield
    finally:
        _forget()
        _z3_module._main_ctx = old


def _forget() -> None:
    for kept in (_var, _wide, bv_const):
        kept.cache_clear()
    _STATES.clear()


@dataclass
class Region:
    """Code one side runs: [lo, hi) with its bytes; `stops` are addresses inside it that end
    a path anyway (the window's start, which the detour reaches as an exit)."""

    lo: int
    hi: int
    code: bytes
    stops: frozenset[int] = frozenset()
    # the instruction boundaries where a path is observed (probe hits, the tracer's writes)
    marks: frozenset[int] = frozenset()
    blocks: dict[int, Block] = field(default_factory=dict)

    def block(self, at: int) -> Block:
        got = self.blocks.get(at)
        if got is None:
            stop = min((m for m in (*self.marks, *self.stops) if m > at), default=self.hi)
            got = lift_block(self.code[at - self.lo : stop - self.lo], at)
            self.blocks[at] = got
        return got


class Shared:
    """The initial state both sides start from."""

    def __init__(self) -> None:
        self.m0 = z3.Function("m0", z3.BitVecSort(64), z3.BitVecSort(8))
        self.chunks: dict[int, Z] = {}
        self.wides: dict[tuple[int, int], Z] = {}
        self.flags = z3.BitVec("rflags", 64)
        self.traced = z3.Bool("traced")  # the probe is attached (the tracer's writes happen)
        self.funcs: dict[tuple[Any, ...], Z] = {}

    def chunk(self, q: int) -> Z:
        v = self.chunks.get(q)
        if v is None:
            if q in (CC_OP, CC_DEP2, CC_NDEP):
                v = z3.BitVecVal(0, 64)  # VEX's COPY thunk: the flags are cc_dep1
            elif q == CC_DEP1:
                v = self.flags
            else:
                v = _var(f"g{q}", 64)
            self.chunks[q] = v
        return v

    def wide(self, off: int, nbytes: int) -> Z:
        """The initial value of `nbytes` (a multiple of 8) of guest state at `off`."""
        key = (off, nbytes)
        v = self.wides.get(key)
        if v is None:
            v = _wide(off, nbytes) if all(q not in _SPECIAL for q in range(off, off + nbytes, 8)) \
                else z3.Concat(*(self.chunk(q) for q in range(off + nbytes - 8, off - 8, -8)))
            self.wides[key] = v
        return v

    def func(self, name: str, args: tuple[int, ...], result: int) -> Z:
        key = (name, args, result)
        f = self.funcs.get(key)
        if f is None:
            f = z3.Function(f"{name}_{'_'.join(map(str, args))}_{result}",
                            *(z3.BitVecSort(b) for b in args), z3.BitVecSort(result))
            self.funcs[key] = f
        return f


@dataclass
class Path:
    """One path of one side."""

    regs: dict[int, tuple[int, int, Z]] = field(default_factory=dict)  # byte -> slot
    written: set[int] = field(default_factory=set)  # guest-state bytes written
    # (address, byte, seen by loads), in order; the tracer's writes are not seen (the
    # assumption: nothing reads them)
    writes: list[tuple[Addr, Z, bool]] = field(default_factory=list)
    loads: list[Z] = field(default_factory=list)  # byte addresses read from m0
    # (original instruction, [(address, size)]) in order: where a fault would happen
    access: list[tuple[int, list[tuple[Addr, int]]]] = field(default_factory=list)
    hits: list[tuple[Z, ...]] = field(default_factory=list)
    cond: list[Z] = field(default_factory=list)
    exit: Z = None
    jumpkind: str = ""
    probe_rsp: list[Z] = field(default_factory=list)  # rsp at each probe hit
    tracer_rsp: list[Z] = field(default_factory=list)  # rsp at each traced NOP
    tracer_at: list[int] = field(default_factory=list)  # where in `writes` its bytes start
    steps: int = 0

    def fork(self) -> Path:
        return Path(regs=dict(self.regs), written=set(self.written), writes=list(self.writes),
                    loads=list(self.loads), access=[(a, list(g)) for a, g in self.access],
                    hits=list(self.hits), cond=list(self.cond), exit=self.exit,
                    jumpkind=self.jumpkind, probe_rsp=list(self.probe_rsp),
                    tracer_rsp=list(self.tracer_rsp), tracer_at=list(self.tracer_at),
                    steps=self.steps)


MAX_STEPS = 256
MAX_PATHS = 16


@functools.lru_cache(maxsize=4096)
def _var(name: str, bits: int) -> Z:
    """A variable (kept, as _bv's constants)."""
    return z3.BitVec(name, bits)


_SPECIAL = (CC_OP, CC_DEP1, CC_DEP2, CC_NDEP)


@functools.lru_cache(maxsize=1024)
def _wide(off: int, nbytes: int) -> Z:
    return z3.Concat(*(_var(f"g{q}", 64) for q in range(off + nbytes - 8, off - 8, -8)))


@functools.lru_cache(maxsize=65536)
def bv_const(v: int, bits: int) -> Z:
    """A constant (kept: z3 makes the same term for the same value, slowly)."""
    return z3.BitVecVal(v, bits)


def is_value(e: Z) -> bool:
    """z3.is_bv_value of a bit-vector term."""
    return bool(z3.Z3_is_numeral_ast(e.ctx.ref(), e.as_ast()))


def split_sum(e: Z) -> tuple[Z, int]:
    """e as (base, constant): `base + c`, or (None, c) for a constant."""
    c, ast = e.ctx.ref(), e.as_ast()
    if z3.Z3_is_numeral_ast(c, ast):
        return None, e.as_long()
    if z3.Z3_get_ast_kind(c, ast) == z3.Z3_APP_AST and \
            z3.Z3_get_decl_kind(c, z3.Z3_get_app_decl(c, ast)) == z3.Z3_OP_BADD and \
            z3.Z3_get_app_num_args(c, ast) == 2:
        a, b = e.arg(0), e.arg(1)
        if is_value(a):
            return b, a.as_long()
        if is_value(b):
            return a, b.as_long()
    return e, 0


def _add_const(e: Z, c: int) -> Z:
    base, k = split_sum(e)
    total = (k + c) & ((1 << e.size()) - 1)
    if base is None:
        return bv_const(total, e.size())
    return base if total == 0 else mk_bin(z3.Z3_mk_bvadd, base, bv_const(total, e.size()))


class Addr:
    """A 64-bit address as `base + k`, split once: two addresses of one base (a register
    plus constants, a constant) are compared without the solver."""

    __slots__ = ("_e", "base", "bid", "k")

    def __init__(self, e: Z, base: Z = None, bid: int = -2, k: int = 0) -> None:
        if bid == -2:
            base, k = split_sum(e)
            bid = -1 if base is None else base.get_id()
        self._e, self.base, self.bid, self.k = e, base, bid, k

    @property
    def e(self) -> Z:
        """The address as an expression (made when first asked: most are never needed)."""
        if self._e is None:
            k = self.k
            self._e = bv_const(k, 64) if self.base is None else (
                self.base if k == 0 else mk_bin(z3.Z3_mk_bvadd, self.base, bv_const(k, 64)))
        return self._e

    def plus(self, c: int) -> Addr:
        if c == 0:
            return self
        return Addr(None, self.base, self.bid, (self.k + c) & 0xFFFFFFFFFFFFFFFF)


def same_address(a: Addr, b: Addr) -> bool | None:
    """True/False when decided without the solver, else None."""
    if a.bid == b.bid:
        return a.k == b.k
    return None


_SIZE = re.compile(r"^Iop_([A-Za-z]+?)(8|16|32|64)([SU]?)$")
_CAST = re.compile(r"^Iop_(\d+)(U|S|HI|to|HL)(?:to)?(\d+)$")


class Machine:
    """Runs one side from one entry, forking at conditions the solver cannot fold."""

    def __init__(self, shared: Shared, region: Region, *, hits: frozenset[int],
                 tracer: frozenset[int], origin: Callable[[int], int]) -> None:
        self.s = shared
        self.region = region
        self.hit_at = hits  # addresses where the tracer reads the registers
        self.tracer = tracer  # the detour's optimized NOPs: the trampoline's writes happen
        self.origin = origin  # instruction address -> the original instruction it copies

    # ---- guest state
    def get(self, p: Path, off: int, nbytes: int) -> Z:
        slot = p.regs.get(off)
        if slot is not None and slot[0] == off and slot[1] == nbytes:
            return slot[2]
        if off % 8 == 0 and nbytes % 8 == 0 and p.regs.keys().isdisjoint(
                range(off, off + nbytes)):
            if nbytes == 8:
                return self.s.chunk(off)
            return self.s.wide(off, nbytes)
        parts = []
        for b in range(off + nbytes - 1, off - 1, -1):
            sl = p.regs.get(b)
            if sl is None:
                q = b - b % 8
                parts.append(mk_extract(8 * (b - q) + 7, 8 * (b - q), self.s.chunk(q)))
            else:
                start, _n, v = sl
                parts.append(mk_extract(8 * (b - start) + 7, 8 * (b - start), v))
        out = parts[0] if len(parts) == 1 else mk_concat(parts)
        return z3.simplify(out)

    def put(self, p: Path, off: int, value: Z) -> None:
        bits = bits_of(value)
        n = max(1, bits // 8)
        if bits < 8:
            value = z3.ZeroExt(8 - bits, value)
        regs = p.regs
        old = {regs[b] for b in range(off, off + n) if b in regs}
        for start, size, v in old:
            if start < off or start + size > off + n:
                for b in range(start, start + size):
                    if not off <= b < off + n:
                        regs[b] = (b, 1, mk_extract(8 * (b - start) + 7, 8 * (b - start), v))
        slot = (off, n, value)
        for b in range(off, off + n):
            p.regs[b] = slot
            p.written.add(b)

    # ---- memory
    def load_byte(self, p: Path, a: Addr) -> Z:
        out = None
        chain: list[tuple[Addr, Z]] = []
        for wa, wv, seen in reversed(p.writes):
            if not seen:
                continue
            same = same_address(a, wa)
            if same is True:
                out = wv
                break
            if same is None:
                chain.append((wa, wv))
        if out is None:
            out = mk_app1(self.s.m0, a.e)
            p.loads.append(a.e)
        for wa, wv in reversed(chain):
            out = mk_ite(mk_eq(a.e, wa.e), wv, out)
        return out

    def load(self, p: Path, addr_e: Z, bits: int, insn: int) -> Z:
        n = max(1, bits // 8)
        addr = Addr(addr_e)
        self._access(p, insn, addr, n)
        parts = [self.load_byte(p, addr.plus(k)) for k in range(n - 1, -1, -1)]
        return parts[0] if n == 1 else mk_concat(parts)

    def store(self, p: Path, addr_e: Z, value: Z, insn: int) -> None:
        n = max(1, bits_of(value) // 8)
        addr = Addr(addr_e)
        self._access(p, insn, addr, n)
        for k in range(n):
            p.writes.append((addr.plus(k), mk_extract(8 * k + 7, 8 * k, value), True))

    def _access(self, p: Path, insn: int, addr: Addr, n: int) -> None:
        orig = self.origin(insn)
        if not p.access or p.access[-1][0] != orig:
            p.access.append((orig, []))
        group = p.access[-1][1]
        if not any(size == n and same_address(addr, a) is True for a, size in group):
            group.append((addr, n))

    # ---- expressions
    def expr(self, p: Path, tmps: dict[int, Z], e: tuple[Any, ...], insn: int) -> Z:
        kind = e[0]
        if kind == "t":
            return tmps[e[1]]
        if kind == "c":
            return bv_const(e[1], e[2])
        if kind == "g":
            return self.get(p, e[1], max(1, e[2] // 8)) if e[2] >= 8 else \
                z3.Extract(e[2] - 1, 0, self.get(p, e[1], 1))
        if kind == "ld":
            return self.load(p, self.expr(p, tmps, e[1], insn), e[2], insn)
        if kind == "ite":
            c = self.expr(p, tmps, e[1], insn)
            t = self.expr(p, tmps, e[2], insn)
            f = self.expr(p, tmps, e[3], insn)
            if is_value(c):
                return t if c.as_long() else f
            return z3.If(c == 1, t, f)
        if kind == "op":
            args = [self.expr(p, tmps, a, insn) for a in e[2]]
            out = self.op(e[1], args, e[3], e[4])
            if all(is_value(a) for a in args):
                out = z3.simplify(out)
            return out
        if kind == "cc":
            args = [self.expr(p, tmps, a, insn) for a in e[2]]
            return self.ccall(e[1], args, e[3])
        raise Unprovable(f"expression {kind}")

    def ccall(self, name: str, args: list[Z], bits: int) -> Z:
        if name == "amd64g_calculate_condition" and is_value(args[0]):
            # cond codes come in pairs (O/NO, B/NB, ...): the odd one is the even one negated
            c = args[0].as_long()
            if is_value(args[1]) and args[1].as_long() == 0:
                v = _condition(c & ~1, args[2])  # COPY: the flags are cc_dep1
            else:
                base = self.s.func(f"{name}{c & ~1}", tuple(bits_of(a) for a in args[1:]), 1)
                v = mk_app(base, args[1:])
            return z3.ZeroExt(bits - 1, ~v if c & 1 else v)
        return mk_app(self.s.func(name, tuple(bits_of(a) for a in args), bits), args)

    def op(self, name: str, a: list[Z], bits: int, arg_bits: tuple[int, ...]) -> Z:
        if "Div" in name:
            raise Unprovable("division (its query does not finish in the budget)")
        m = _SIZE.match(name)
        if m is not None:
            base, signed = m.group(1), m.group(3)
            w = int(m.group(2))
            simple = {"Add": lambda: a[0] + a[1], "Sub": lambda: a[0] - a[1],
                      "Mul": lambda: a[0] * a[1], "And": lambda: a[0] & a[1],
                      "Or": lambda: a[0] | a[1], "Xor": lambda: a[0] ^ a[1],
                      "Not": lambda: ~a[0]}
            if base in simple and not signed:
                if base in ("Add", "Sub") and is_value(a[1]) and not is_value(a[0]):
                    k = a[1].as_long()
                    return _add_const(a[0], k if base == "Add" else -k)
                if base == "Add" and is_value(a[0]) and not is_value(a[1]):
                    return _add_const(a[1], a[0].as_long())
                return simple[base]()
            if base in ("Shl", "Shr", "Sar"):
                amount = z3.ZeroExt(w - 8, a[1]) if w > 8 else a[1]
                if base == "Shl":
                    return a[0] << amount
                return z3.LShR(a[0], amount) if base == "Shr" else a[0] >> amount
            cmp = {"CmpEQ": lambda: a[0] == a[1], "CasCmpEQ": lambda: a[0] == a[1],
                   "CmpNE": lambda: a[0] != a[1], "CasCmpNE": lambda: a[0] != a[1],
                   "ExpCmpNE": lambda: a[0] != a[1]}
            if base in cmp and not signed:
                return _bool(cmp[base]())
            if base == "CmpLT":
                return _bool(a[0] < a[1] if signed == "S" else z3.ULT(a[0], a[1]))
            if base == "CmpLE":
                return _bool(a[0] <= a[1] if signed == "S" else z3.ULE(a[0], a[1]))
            if base == "CmpNEZ":
                return _bool(a[0] != 0)
            if base in ("MullU", "MullS"):
                ext = z3.SignExt if base == "MullS" else z3.ZeroExt
                return ext(w, a[0]) * ext(w, a[1])
        m = _CAST.match(name)
        if m is not None:
            src, how, dst = int(m.group(1)), m.group(2), int(m.group(3))
            x = a[0]
            if how == "U" and dst > src:
                return z3.ZeroExt(dst - src, x)
            if how == "S" and dst > src:
                return z3.SignExt(dst - src, x)
            if how == "to" and dst < src:
                return z3.Extract(dst - 1, 0, x)
            if how == "HI" and dst * 2 == src:
                return z3.Extract(src - 1, dst, x)
            if how == "HL" and dst == 2 * src:
                return z3.Concat(a[0], a[1])
        bitwise = {"Iop_AndV128": "&", "Iop_OrV128": "|", "Iop_XorV128": "^",
                   "Iop_AndV256": "&", "Iop_OrV256": "|", "Iop_XorV256": "^"}
        if name in bitwise:
            o = bitwise[name]
            return a[0] & a[1] if o == "&" else (a[0] | a[1] if o == "|" else a[0] ^ a[1])
        if name in ("Iop_NotV128", "Iop_NotV256", "Iop_Not1"):
            return ~a[0]
        if name in ("Iop_And1", "Iop_Or1"):
            return a[0] & a[1] if name == "Iop_And1" else a[0] | a[1]
        if name.startswith("Iop_Reinterp"):
            return a[0]
        vec = {"Iop_V128to64": lambda: z3.Extract(63, 0, a[0]),
               "Iop_V128HIto64": lambda: z3.Extract(127, 64, a[0]),
               "Iop_V128to32": lambda: z3.Extract(31, 0, a[0]),
               "Iop_64HLtoV128": lambda: z3.Concat(a[0], a[1]),
               "Iop_32UtoV128": lambda: z3.ZeroExt(96, a[0]),
               "Iop_64UtoV128": lambda: z3.ZeroExt(64, a[0]),
               "Iop_SetV128lo64": lambda: z3.Concat(z3.Extract(127, 64, a[0]), a[1]),
               "Iop_SetV128lo32": lambda: z3.Concat(z3.Extract(127, 32, a[0]), a[1]),
               "Iop_V256toV128_0": lambda: z3.Extract(127, 0, a[0]),
               "Iop_V256toV128_1": lambda: z3.Extract(255, 128, a[0]),
               "Iop_V128HLtoV256": lambda: z3.Concat(a[0], a[1])}
        if name in vec:
            return vec[name]()
        # any other pure operation: a function of its operands
        return mk_app(self.s.func(name, arg_bits, bits), a)

    # ---- statements
    def snapshot(self, p: Path) -> tuple[Z, ...]:
        regs = [self.get(p, off, 8) for _n, off in GPRS]
        regs += [self.get(p, YMM0 + 32 * i, 16) for i in range(16)]
        return (*regs, self.flags(p))

    def flags(self, p: Path) -> Z:
        thunk = [self.get(p, o, 8) for o in (CC_OP, CC_DEP1, CC_DEP2, CC_NDEP)]
        if is_value(thunk[0]) and thunk[0].as_long() == 0:  # COPY: the flags are cc_dep1
            return mk_bin(z3.Z3_mk_bvand, thunk[1], mk_val(STATUS_FLAGS, thunk[1]))
        f = mk_app(self.s.func("amd64g_calculate_rflags_all", (64, 64, 64, 64), 64), thunk)
        return mk_bin(z3.Z3_mk_bvand, f, mk_val(STATUS_FLAGS, f))

    def tracer_writes(self, p: Path, at: int) -> None:
        """The optimized hit at the detour's NOP: `call` pushes at+5, the trampoline pushes
        rcx, r11, rax, below rsp (only when traced; registers come back unchanged)."""
        rsp = Addr(self.get(p, RSP, 8))
        p.tracer_rsp.append(rsp.e)
        p.tracer_at.append(len(p.writes))
        values = [bv_const(at + 5, 64), self.get(p, 24, 8), self.get(p, 104, 8),
                  self.get(p, 16, 8)]
        for k, v in enumerate(values):
            for b in range(8):
                p.writes.append((rsp.plus(-8 * (k + 1) + b), mk_extract(8 * b + 7, 8 * b, v),
                                 False))

    def run(self, entry: int) -> list[Path]:
        done: list[Path] = []
        if not self.region.lo <= entry < self.region.hi:  # e.g. a call's return at the end
            return [Path(exit=bv_const(entry, 64), jumpkind="Ijk_Boring")]
        # Depth first over the paths: a conditional exit with a symbolic guard forks the path
        # (each side keeps its condition), a concrete one is just taken; a path ends when
        # control leaves the region. Both bounds make a loop Unprovable, not an endless run.
        work: list[tuple[Path, int]] = [(Path(), entry)]
        while work:
            p, at = work.pop()
            while True:
                if len(done) + len(work) > MAX_PATHS:
                    raise Unprovable(f"more than {MAX_PATHS} paths")
                try:
                    blk = self.region.block(at)
                except Undecodable:  # SIGILL there: the path ends in a fault
                    p.exit, p.jumpkind = bv_const(self.origin(at), 64), FAULT
                    done.append(p)
                    break
                tmps: dict[int, Z] = {}
                nxt = None
                insn = at
                for st in blk.stmts:
                    kind = st[0]
                    if kind == "im":
                        insn = st[1]
                        p.steps += 1
                        if p.steps > MAX_STEPS:
                            raise Unprovable(f"the code runs more than {MAX_STEPS} "
                                             f"instructions (a loop, or a rep prefix)")
                        # a probe hit is observable: the registers at it, compared later
                        if insn in self.hit_at:
                            p.hits.append(self.snapshot(p))
                            p.probe_rsp.append(self.get(p, RSP, 8))
                        if insn in self.tracer:
                            self.tracer_writes(p, insn)
                    elif kind == "wr":
                        tmps[st[1]] = self.expr(p, tmps, st[2], insn)
                    elif kind == "put":
                        self.put(p, st[1], self.expr(p, tmps, st[2], insn))
                    elif kind == "st":
                        self.store(p, self.expr(p, tmps, st[1], insn),
                                   self.expr(p, tmps, st[2], insn), insn)
                    elif kind == "exit":
                        g = z3.simplify(self.expr(p, tmps, st[1], insn))
                        if is_value(g) and g.as_long() == 0:
                            continue
                        target = bv_const(st[2], 64)
                        if st[3] in FAULTS:  # the instruction faults: the path ends at it
                            target, jk = bv_const(self.origin(insn), 64), FAULT
                        else:
                            jk = st[3]
                        if is_value(g):
                            nxt = (target, jk)
                            break
                        other = p.fork()
                        other.cond.append(g == 1)
                        p.cond.append(g == 0)
                        self._continue(other, target, jk, work, done)
                    elif kind == "cas":  # lock cmpxchg: one thread, so a load and a store
                        _k, old, addr_e, expd_e, new_e, bits = st
                        addr = self.expr(p, tmps, addr_e, insn)
                        expd = self.expr(p, tmps, expd_e, insn)
                        new = self.expr(p, tmps, new_e, insn)
                        cur = self.load(p, addr, bits, insn)
                        tmps[old] = cur
                        self.store(p, addr, z3.If(cur == expd, new, cur), insn)
                    elif kind == "ldg":
                        _k, dst, addr_e, alt_e, guard_e, cvt, lbits = st
                        g = z3.simplify(self.expr(p, tmps, guard_e, insn))
                        alt = self.expr(p, tmps, alt_e, insn)
                        # a guard that depends on the state would fork inside one
                        # instruction; not modelled: the emulator checks such a detour
                        if cvt is not None or not is_value(g):
                            raise Unprovable("a guarded load with a symbolic guard")
                        tmps[dst] = self.load(p, self.expr(p, tmps, addr_e, insn), lbits,
                                              insn) if g.as_long() else alt
                    elif kind == "stg":
                        g = z3.simplify(self.expr(p, tmps, st[3], insn))
                        if not is_value(g):
                            raise Unprovable("a guarded store with a symbolic guard")
                        if g.as_long():
                            self.store(p, self.expr(p, tmps, st[1], insn),
                                       self.expr(p, tmps, st[2], insn), insn)
                # the block's end: a concrete target inside the region goes on in this path;
                # anything else (a symbolic target, a call out, a return) is this path's exit
                if nxt is None:
                    nxt = (z3.simplify(self.expr(p, tmps, blk.next, insn)), blk.jumpkind)
                target, jk = nxt
                if self._inside(target, jk):
                    at = target.as_long()
                    continue
                p.exit, p.jumpkind = target, jk
                done.append(p)
                break
        return done

    def _inside(self, target: Z, jk: str = "") -> bool:
        if jk == FAULT:
            return False
        if not is_value(target):
            return False
        t = target.as_long()
        return self.region.lo <= t < self.region.hi and t not in self.region.stops

    def _continue(self, p: Path, target: Z, jk: str, work: list[tuple[Path, int]],
                  done: list[Path]) -> None:
        if self._inside(target, jk):
            work.append((p, target.as_long()))
        else:
            p.exit, p.jumpkind = target, jk
            done.append(p)


def _condition(even: int, flags: Z) -> Z:
    """x86 condition `even` (O, B, Z, BE, S, P, L, LE: 0, 2, ..., 14) of an rflags value, as
    one bit."""
    def bit(n: int) -> Z:
        return z3.Extract(n, n, flags)

    cf, pf, zf, sf, of = bit(0), bit(2), bit(6), bit(7), bit(11)
    return {0: of, 2: cf, 4: zf, 6: cf | zf, 8: sf, 10: pf, 12: sf ^ of,
            14: (sf ^ of) | zf}[even]


def _bool(b: Z) -> Z:
    return z3.If(b, bv_const(1, 1), bv_const(0, 1))


def _final_byte(path: Path, a: Addr, shared: Shared, hidden: bool = True) -> Z:
    """The byte at `a` after `path`: its last write that is surely at `a`, then each later
    write that may be (if-then-else), over `m0` when no write surely is."""
    chain: list[tuple[Addr, Z, bool]] = []
    out = None
    for wa, wv, seen in reversed(path.writes):
        if not seen and not hidden:
            continue
        same = same_address(a, wa)
        if same is False:
            continue
        if same is True and seen:
            out = wv
            break
        chain.append((wa, wv, seen))
    if out is None:
        out = mk_app1(shared.m0, a.e)
    for wa, wv, seen in reversed(chain):
        new = wv if seen else mk_ite(shared.traced, wv, out)
        out = new if same_address(a, wa) is True else mk_ite(mk_eq(a.e, wa.e), new, out)
    return out


@dataclass(frozen=True, slots=True)
class Dead:
    """The tracer's bytes, assumed dead: [rsp - skip - 32, rsp - skip) with rsp the window's
    at its probe (skip 128 under the red-zone guard, 0 where the red zone is unused)."""

    skip: int


def differences(w: Path, d: Path, m_w: Machine, m_d: Machine, shared: Shared,
                returns: dict[int, tuple[int, ...]], dead: Dead | None
                ) -> list[tuple[str, Z, Z]]:
    """What may differ between a window path and a detour path: (what, condition, the
    address of a memory byte or None)."""
    out: list[tuple[str, Z, Z]] = []
    # the exit; a call's pushed return address may be another the rewriter allows
    # (`returns`: the detour's copy, a moved call's, whose return site is proved as an entry
    # of its own; the window's end itself, an emulated call's)
    slot: tuple[Z, tuple[int, ...]] | None = None
    if w.jumpkind == "Ijk_Call":
        rsp = m_w.get(w, RSP, 8)
        ret = z3.simplify(m_w.load(w.fork(), rsp, 64, 0))
        if is_value(ret) and ret.as_long() in returns:
            slot = (rsp, returns[ret.as_long()])
    if (w.jumpkind == FAULT) != (d.jumpkind == FAULT):
        out.append(("a fault on one side only", z3.BoolVal(True), None))
    out.append(("the exit" if w.jumpkind != FAULT else "the faulting instruction",
                w.exit != d.exit, None))
    # registers: every 8 bytes of guest state either side wrote
    chunks = sorted({b - b % 8 for b in w.written | d.written
                     if not any(b in r for r in _NOT_STATE)})
    for q in chunks:
        a, b = m_w.get(w, q, 8), m_d.get(d, q, 8)
        if not same_term(a, b):
            out.append((_reg_name(q), a != b, None))
    fw, fd = m_w.flags(w), m_d.flags(d)
    if not same_term(fw, fd):
        out.append(("the flags", fw != fd, None))
    # memory: each byte either side wrote
    # the tracer's bytes lie where the assumption says nothing reads them (the detour's rsp
    # at each traced NOP is the window's at its probe less the guard's skip): a byte outside
    # them is untouched by the tracer, and the tracer's writes need not be modelled
    contained = dead is not None and len(d.tracer_rsp) == len(w.probe_rsp) and all(
        Addr(t).bid == Addr(r).bid and
        (Addr(r).k - dead.skip - Addr(t).k) & 0xFFFFFFFFFFFFFFFF == 0
        for t, r in zip(d.tracer_rsp, w.probe_rsp, strict=True))
    seen: set[tuple[int, int]] = set()
    for a, _v, visible in (*w.writes, *d.writes):
        # a byte only the tracer wrote, where the assumption puts it: nothing to compare
        if (a.bid, a.k) in seen or (contained and not visible):
            continue
        seen.add((a.bid, a.k))
        vw, vd = _final_byte(w, a, shared), _final_byte(d, a, shared, hidden=False)
        if slot is not None:
            rsp, allowed = slot
            r = Addr(rsp)
            k = (a.k - r.k) & 0xFFFFFFFFFFFFFFFF if a.bid == r.bid else None
            if k is not None and 0 <= k < 8:
                # byte k of the 8 the detour pushed must be that byte of an allowed value,
                # and the 8 must be one value: compare the whole slot once, at its byte 0
                if k:
                    continue
                pushed = z3.Concat(*(_final_byte(d, r.plus(j), shared, hidden=False)
                                     for j in range(7, -1, -1)))
                differ = z3.And(*(pushed != bv_const(v, 64) for v in allowed))
                for j in range(8):
                    seen.add((r.bid, (r.k + j) & 0xFFFFFFFFFFFFFFFF))
            else:
                differ = _ne(vw, vd)
        else:
            differ = _ne(vw, vd)
        if d.tracer_at and not (contained and is_false_term(differ)):
            # a byte the traced hit wrote last: not compared when it lies in the dead bytes
            # (the assumption), a difference (if its value differs) when it does not
            clobbered = _clobbered(d, a, shared)
            if not is_false_term(clobbered):
                dead_here = _in_dead(a, w, dead)
                if contained:  # the tracer's bytes are the dead ones
                    differ = z3.And(z3.Not(clobbered), differ)
                else:
                    full = _final_byte(d, a, shared)
                    differ = z3.If(clobbered, z3.And(z3.Not(dead_here), vw != full), differ)
        if is_false_term(differ):
            continue
        out.append((MEMORY, differ, a.e))
    # the probe: reached as often, with the same registers
    if len(w.hits) != len(d.hits):
        out.append((f"the probe reached {len(d.hits)} times, not {len(w.hits)}",
                    z3.BoolVal(True), None))
    else:
        for i, (hw, hd) in enumerate(zip(w.hits, d.hits, strict=True)):
            ne = [x != y for x, y in zip(hw, hd, strict=True) if not same_term(x, y)]
            if ne:
                out.append((f"the registers at probe hit {i}", z3.Or(*ne), None))
    # faults: the same accesses, instruction by instruction
    if [g for g, _ in w.access] != [g for g, _ in d.access]:
        out.append(("the instructions that access memory", z3.BoolVal(True), None))
    else:
        for (insn, gw), (_i, gd) in zip(w.access, d.access, strict=True):
            same = z3.And(*(z3.Or(*(a.e == b.e for b, n in gd if n == size)) if
                            any(n == size for _b, n in gd) else z3.BoolVal(False)
                            for a, size in gw),
                          *(z3.Or(*(a.e == b.e for b, n in gw if n == size)) if
                            any(n == size for _b, n in gw) else z3.BoolVal(False)
                            for a, size in gd))
            s = z3.simplify(same)
            if not z3.is_true(s):
                out.append((f"the memory accessed at {insn:#x}", z3.Not(s), None))
    return out


def _ne(a: Z, b: Z) -> Z:
    return z3.BoolVal(False) if same_term(a, b) else a != b


def _in_dead(a: Addr, w: Path, dead: Dead | None) -> Z:
    """Whether byte `a` lies in the dead bytes below a probe hit of the window."""
    if dead is None:
        return z3.BoolVal(False)
    out = []
    for rsp in w.probe_rsp:
        low = Addr(rsp).plus(-dead.skip - TRAMPOLINE_BYTES)
        if low.bid == a.bid:
            out.append(z3.BoolVal((a.k - low.k) & 0xFFFFFFFFFFFFFFFF < TRAMPOLINE_BYTES))
        else:
            out.append(z3.ULT(a.e - low.e, TRAMPOLINE_BYTES))
    return z3.Or(*out) if out else z3.BoolVal(False)


def _clobbered(d: Path, a: Addr, shared: Shared) -> Z:
    """Whether the last write of byte `a` on path `d` is a traced hit's."""
    conds = []
    for rsp, start in zip(d.tracer_rsp, d.tracer_at, strict=True):
        low = Addr(rsp).plus(-TRAMPOLINE_BYTES)
        if low.bid == a.bid:
            if (a.k - low.k) & 0xFFFFFFFFFFFFFFFF >= TRAMPOLINE_BYTES:
                continue
            inside = z3.BoolVal(True)
        else:
            inside = z3.ULT(a.e - low.e, TRAMPOLINE_BYTES)
        later = []
        overwritten = False
        for wa, _v, _seen in d.writes[start + TRAMPOLINE_BYTES:]:
            same = same_address(a, wa)
            if same is True:
                overwritten = True
                break
            if same is None:
                later.append(a.e != wa.e)
        if not overwritten:
            conds.append(z3.And(inside, *later))
    if not conds:
        return z3.BoolVal(False)
    return z3.And(shared.traced, z3.Or(*conds))


def _reg_name(q: int) -> str:
    for name, off in GPRS:
        if off == q:
            return name
    if YMM0 <= q < YMM0 + 16 * 32:
        return f"ymm{(q - YMM0) // 32}"
    return f"guest state at {q}"


@dataclass(frozen=True, slots=True)
class Model:
    """A counterexample: the initial state (plain integers)."""

    gprs: dict[str, int]
    ymm: tuple[int, ...]  # ymm0-15, 256 bits each
    rflags: int
    memory: dict[int, int]  # address -> byte of the initial memory the paths read
    default_byte: int
    traced: bool
    what: str


def plausible(w: Path, d: Path, code: list[tuple[int, int]]) -> list[Z]:
    """What a state the emulator can replay needs: every access in user space above page
    zero and outside the window's and the detour's own code (the bytes the rewrite changes,
    which the model takes as equal data on both sides). A state where the window faults
    is the accesses' question (both fault at the same instruction), not the others'.
    A constant address (rip-relative: the file's addresses, moved with the code at load
    time) is held to the code only: below 64 KiB it is a link-time address, not a fault.
    `solve` refuses to prove a pair of feasible paths that no state satisfying this takes
    (a window that must read its own bytes, e.g. `mov -8(%rip)`, is not modelled)."""
    out: list[Z] = []
    for path in (w, d):
        for _insn, group in path.access:
            for a, n in group:
                if a.base is None:
                    # an access overlapping the code: the condition is false, not a fault
                    k = a.k
                    if any(k < hi and lo < k + n for lo, hi in code):
                        out.append(z3.BoolVal(False))
                    continue
                e = a.e
                out.append(mk_cmp(z3.Z3_mk_bvuge, e, mk_val(0x10000, e)))
                out.append(mk_cmp(z3.Z3_mk_bvule, e, mk_val((1 << 47) - n, e)))
                for lo, hi in code:
                    end = mk_bin(z3.Z3_mk_bvadd, e, mk_val(n, e))
                    below = mk_cmp(z3.Z3_mk_bvule, end, mk_val(lo, e))
                    out.append(mk_or(below, mk_cmp(z3.Z3_mk_bvuge, e, mk_val(hi, e))))
    for t in d.tracer_rsp:  # the stack the tracer writes to is user memory too
        out += [z3.UGE(t, 0x10000 + TRAMPOLINE_BYTES), z3.ULE(t, 1 << 47)]
    return out


def _valid(a: Addr, n: int) -> Z:
    """Whether an access of `n` bytes at `a` can be mapped: in user space above 64 KiB (a
    constant, link-time address always)."""
    if a.base is None:
        return z3.BoolVal(True)
    return z3.And(z3.UGE(a.e, 0x10000), z3.ULE(a.e, (1 << 47) - n))


def fault_witness(w: Path, d: Path) -> list[Z]:
    """What makes a difference in the accesses one the replay shows: every access before
    some instruction valid on both sides, and at that instruction exactly one side's
    invalid (it faults there, the other does not). Empty when the accesses are not grouped
    alike (the plain difference is all there is)."""
    if [g for g, _ in w.access] != [g for g, _ in d.access]:
        return []
    ways: list[Z] = []
    before: list[Z] = []
    for (_i, gw), (_j, gd) in zip(w.access, d.access, strict=True):
        bad_w = z3.Not(z3.And(*(_valid(a, n) for a, n in gw)))
        bad_d = z3.Not(z3.And(*(_valid(a, n) for a, n in gd)))
        ways.append(z3.And(*before, z3.Xor(bad_w, bad_d)))
        before += [_valid(a, n) for a, n in (*gw, *gd)]
    return [z3.Or(*ways)] if ways else []


def replayable(w: Path, d: Path) -> list[Z]:
    """What a counterexample's exits should meet for the replay to show them: each an
    address a jump can leave to (in user space above 64 KiB; a jump to a non-canonical
    address faults at the jump itself, one into page zero at its target on both sides).
    Asked for, not assumed: a difference only such states show is still one."""
    out: list[Z] = []
    for path in (w, d):
        if path.jumpkind != FAULT and not is_value(path.exit):
            out += [z3.UGE(path.exit, 0x10000), z3.ULT(path.exit, 1 << 47)]
    return out


# The concrete states `witnessed` tries: (every 64-bit variable of guest state a pointer
# into user space, distinct ones or all one; rflags; what every uninterpreted operation
# returns; memory holding a user-space pointer in every aligned 8 bytes, or zeros). The
# pointers lie far above a file's link-time code and far below 2**47: the variable of
# guest state at q holds _POINTER + q * _STRIDE (distinct) or _POINTER
_WITNESSES = ((True, 0, 0, True), (True, STATUS_FLAGS, -1, True), (False, 0x40, 1, False),
              (True, 0x40, 0, False))
_POINTER = 0x10_0000_0000
_STRIDE = 0x1000_0000


def witnessed(facts: list[Z], shared: Shared) -> bool:
    """Whether a state of `_WITNESSES` makes every fact true: each variable and function of
    `shared` replaced by its value in that state and the ground term simplified (z3
    evaluates it; no search). True shows the facts can hold together; False says nothing
    (a fact may name a variable or function no state gives a value: it does not fold)."""
    if not facts:
        return True
    goal = mk_and(*facts)
    ctx = goal.ctx
    for vs, fs in _witness_states(shared):
        t = _ref(z3.Z3_substitute(ctx.ref(), goal.as_ast(), len(vs[0]), vs[0], vs[1]), ctx)
        e = _ref(z3.Z3_substitute_funs(ctx.ref(), t.as_ast(), len(fs[0]), fs[0], fs[1]), ctx)
        if z3.is_true(z3.simplify(e)):
            return True
    return False


_GUEST_BYTES = 1280  # VEX's amd64 guest state, rounded up: the variables `witnessed` sets
_STATES: dict[tuple[Any, ...], list[tuple[Any, Any]]] = {}


def _witness_states(shared: Shared) -> list[tuple[Any, Any]]:
    """The substitutions of `witnessed`'s states for the variables and functions (z3's
    arrays, made once per set of functions: z3.substitute checks every pair again). The
    variable of guest state at q is the same term in every `Shared`, so are its functions."""
    key = tuple(sorted(shared.funcs))
    got = _STATES.get(key)
    if got is not None:
        return got
    names = [(q, _var(f"g{q}", 64)) for q in range(0, _GUEST_BYTES, 8) if q not in _SPECIAL]
    slot = z3.Extract(2, 0, z3.Var(0, z3.BitVecSort(64)))
    out = []
    for distinct, flags, ret, pointers in _WITNESSES:
        subst = [(v, bv_const(_POINTER + (q * _STRIDE if distinct else 0), 64)) for q, v in names]
        subst += [(shared.flags, bv_const(flags, 64)), (shared.traced, z3.BoolVal(False))]
        # memory: _POINTER's bytes (little-endian: 0x10 at byte 4) in every aligned 8
        byte = (z3.If(slot == 4, bv_const(_POINTER >> 32, 8), bv_const(0, 8)) if pointers
                else bv_const(0, 8))
        funs = [(shared.m0, byte)]
        funs += [(f, bv_const(ret & ((1 << f.range().size()) - 1), f.range().size()))
                 for _k, f in sorted(shared.funcs.items())]
        out.append((_arrays(z3.Ast, [(a.as_ast(), b.as_ast()) for a, b in subst],
                            [x for pair in subst for x in pair]),
                    _arrays(z3.FuncDecl, [(f.as_func_decl(), b.as_ast()) for f, b in funs],
                            [x for pair in funs for x in pair])))
    if len(_STATES) >= 256:  # kept per set of functions a rewrite's detours use
        _STATES.clear()
    _STATES[key] = out
    return out


def _arrays(kind: Any, pairs: list[tuple[Any, Any]], keep: list[Z]) -> tuple[Any, Any, Any]:
    src, dst = (kind * len(pairs))(), (z3.Ast * len(pairs))()
    for i, (a, b) in enumerate(pairs):
        src[i], dst[i] = a, b
    return src, dst, keep  # `keep`: the Python objects that hold the terms' references


def solve(pairs: Sequence[tuple[list[Z], list[tuple[str, Z, Z]], list[Z], list[Z],
                            Callable[[], list[Z]], Callable[[], list[Z]]]],
          shared: Shared,
          rlimit: int) -> tuple[str, Model | None, int]:
    """Each (path conditions, differences, addresses read, what a shown difference assumes,
    what makes a difference in the accesses one the replay shows: `fault_witness`, and
    what a counterexample should meet to be replayable: `replayable`; both made when asked)
    pair asked in turn: ("proved", None), ("differs", counterexample),
    ("unknown", None), or ("vacuous", None) when a pair of paths whose conditions can hold
    together is taken by no state the assumptions admit (its accesses must land in the
    changed bytes, below 64 KiB or outside user space: a proof under them would say nothing
    about that pair); and the resource units used."""
    used = 0

    def check(*facts: Z) -> tuple[Z, Z]:
        nonlocal used
        s = z3.Solver()
        s.set("rlimit", rlimit - used if rlimit > used else 1)
        c, solver = s.ctx.ref(), s.solver
        for f in facts:  # s.add(*facts) of Boolean terms
            if isinstance(f, _BoolRef):
                z3.Z3_solver_assert(c, solver, f.as_ast())
            else:
                s.add(f)
        before = rlimit_count(s)
        res = s.check()
        used += rlimit_count(s) - before
        return res, s

    for cond, diffs, reads, assume_all, witness, prefer in pairs:
        assume = [a for a in assume_all if not is_true_term(a)]
        live = [(w, c, x) for w, c, x in diffs if not is_false_term(c)]
        # what a run shows first (the exit, registers, memory, probe hits), then where it
        # would fault: a model of the first kind is one the emulator can confirm
        shown = [d for d in live if not d[0].startswith(ACCESSES)]
        hidden = [d for d in live if d[0].startswith(ACCESSES)]
        if assume and not witnessed([*cond, *assume], shared):
            # the shown differences are asked under `assume`: it must admit some state of
            # the pair when the pair is feasible at all (else "proved" would be vacuous);
            # a concrete state shows it most often, else the solver is asked
            res, _s = check(*cond, *assume)
            if res == z3.unsat:
                res, _s = check(*cond)
                if res == z3.sat:
                    return "vacuous", None, used
                if res == z3.unsat:
                    continue  # the two paths are never taken together
            if res != z3.sat:
                return "unknown", None, used
        for group in (shown, hidden):
            if not group:
                continue
            differ = z3.Or(*(c for _w, c, _x in group))
            faults = witness() if group is hidden else []
            if faults:
                # a state in which one side faults where the other does not, if there is
                # one (the replay can show it); else any state the accesses differ in
                res, s = check(*cond, differ, *faults)
                if res == z3.sat:
                    return "differs", _model(s.model(), shared, group, reads), used
            res, s = check(*cond, *(assume if group is shown else ()), differ)
            if res == z3.unsat:
                continue
            if res != z3.sat:
                return "unknown", None, used
            # a state the replay can show, if the difference has one: both exits where a
            # jump leaves rather than faults (a non-canonical target faults at the jump on
            # both sides)
            better = prefer() if group is shown else []
            if better:
                res, s2 = check(*cond, *assume, differ, *better)
                if res == z3.sat:
                    s = s2
            return "differs", _model(s.model(), shared, group, reads), used
    return "proved", None, used


def rlimit_count(s: Z) -> int:
    """z3's resource count so far (one counter for the context: the difference across a
    check is what the check used)."""
    c = s.ctx.ref()
    stats = z3.Z3_solver_get_statistics(c, s.solver)
    z3.Z3_stats_inc_ref(c, stats)
    try:  # s.statistics().get_key_value("rlimit count"), 0 when it has none
        for i in range(z3.Z3_stats_size(c, stats)):
            if z3.Z3_stats_get_key(c, stats, i) == "rlimit count":
                if z3.Z3_stats_is_uint(c, stats, i):
                    return int(z3.Z3_stats_get_uint_value(c, stats, i))
                return int(z3.Z3_stats_get_double_value(c, stats, i))
        return 0
    finally:
        z3.Z3_stats_dec_ref(c, stats)


def _model(m: Z, shared: Shared, live: list[tuple[str, Z, Z]], reads: list[Z]) -> Model:
    def val(e: Z) -> int:
        return int(m.eval(e, model_completion=True).as_long())

    gprs = {name: val(shared.chunk(off)) for name, off in GPRS}
    ymm = tuple(sum(val(shared.chunk(YMM0 + 32 * i + 8 * k)) << (64 * k) for k in range(4))
                for i in range(16))
    memory: dict[int, int] = {}
    for a in reads:
        memory[val(a)] = val(shared.m0(a))
    default = 0
    try:
        interp = m[shared.m0]
        els = interp.else_value() if interp is not None else None
        if els is not None and z3.is_bv_value(els):
            default = els.as_long()
        for i in range(interp.num_entries() if interp is not None else 0):
            ent = interp.entry(i)
            k, v = ent.arg_value(0), ent.value()
            if z3.is_bv_value(k) and z3.is_bv_value(v):
                memory.setdefault(k.as_long(), v.as_long())
    except z3.Z3Exception:  # m0 not in the model (no memory read matters)
        pass
    what = live[0][0]
    for w, c, x in live:
        if z3.is_true(m.eval(c, model_completion=True)):
            what = w if x is None else f"{w} {val(x):#x}"
            break
    return Model(gprs=gprs, ymm=ymm, rflags=val(shared.flags) & STATUS_FLAGS, memory=memory,
                 default_byte=default,
                 traced=z3.is_true(m.eval(shared.traced, model_completion=True)), what=what)


__all__ = ["Dead", "Machine", "Model", "NotLiftable", "Path", "Region", "Shared",
           "Unprovable", "differences", "fault_witness", "fresh_context", "plausible",
           "replayable", "solve"]
