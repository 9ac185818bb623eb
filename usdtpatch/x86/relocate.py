"""Relocating a patch window into a detour. The only module that imports iced-x86.

Reference: docs/usdt-format.md ("The code around a 1-byte probe", "Encoders and writers").
iced's BlockEncoder re-encodes instructions at a new address: it fixes rip-relative
displacements, retargets branches and widens short ones. Its two hazards are checked on every
output: a branch or rip-relative operand out of +/-2 GiB reach comes out as an absolute
`jmp qword ptr [rip+X]` (`ff 25`) with an 8-byte literal, and a rip-relative operand whose
target lies below 4 GiB can come out with a `67` address-size prefix. Neither is accepted.

The detour is laid out as

    [window instructions before the probe]   re-encoded by iced
    [the new probe site bytes]               verbatim (nop5, combo5, combo10, maybe guarded)
    [window instructions after the probe]    re-encoded by iced
    jmp window_end                           re-encoded by iced

(with one site part per probe when a window holds several, as adjacent probes do). The parts
are encoded separately so each probe's address is known without guessing. A branch to the
window start keeps its original target (which now holds `jmp detour`). A branch from inside
the window to an instruction strictly inside it (a backward window such as `je L; nop; L:`,
whose only source of L is in the window) is retargeted to that instruction's copy in the
detour: its original address is now `int3` or the middle of the `jmp`. Since parts are
encoded separately and a retargeted branch may change size, the layout is recomputed until it
is stable. The output is then decoded back with capstone and compared instruction by
instruction with the original window: same mnemonics, same branch targets (mapped into the
detour for the inner ones), same rip-relative targets, same other operands.

A `call` of the window is re-encoded like any other instruction (it then returns into the
detour), unless its address is in `emulate`: then it becomes `push %rax; lea RET(%rip),%rax;
xchg %rax,(%rsp); jmp TARGET` (the original return address RET pushed, no register or flag
changed, then a jump with the call's own operand, an `(%rsp)`-based one adjusted by 8), so the
callee returns into the original function. Only the window's last instruction can be
emulated: RET must be the window's end, which keeps its original code.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

import iced_x86

from usdtpatch.x86.decode import CodeInsn, Sweep, sweep

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
ADDRESS_LIMIT = 1 << 64
MAX_DETOUR_BYTES = 4096  # far more than a window's instructions, a site and a jmp
_LEGACY_PREFIXES = frozenset({0x66, 0x67, 0xF0, 0xF2, 0xF3, 0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65})


class RelocationError(Exception):
    """The window cannot be relocated safely; the message says why (becomes a finding)."""


_PAIR = struct.Struct("<QQ")


@dataclass(frozen=True, slots=True, init=False)
class Detour:
    """The relocated window at `address`.

    `insn_map`: (original address, detour address) of every relocated instruction, in order,
    then (window end, address of the final jmp). It is kept packed (`packed_map`, 16 bytes a
    pair, ~0.35 KB less a detour than a tuple of tuples: a rewrite holds one per site, issue
    38) and made again when read."""

    address: int
    code: bytes
    probe_address: int  # where the new probe site bytes start
    site_length: int  # bytes of the new probe site (guard included)
    packed_map: bytes = field(repr=False)

    def __init__(self, address: int, code: bytes, probe_address: int, site_length: int,
                 insn_map: Iterable[tuple[int, int]] | None = None,
                 packed_map: bytes | None = None) -> None:
        """`insn_map` as pairs; `packed_map` (what dataclasses.replace passes on) when
        `insn_map` is not given."""
        if insn_map is not None:
            packed_map = b"".join(_PAIR.pack(o, n) for o, n in insn_map)
        if packed_map is None:
            raise TypeError("Detour needs its insn_map")
        object.__setattr__(self, "address", address)
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "probe_address", probe_address)
        object.__setattr__(self, "site_length", site_length)
        object.__setattr__(self, "packed_map", packed_map)

    @property
    def insn_map(self) -> tuple[tuple[int, int], ...]:
        return tuple(_PAIR.iter_unpack(self.packed_map))

    @property
    def end(self) -> int:
        return self.address + len(self.code)


def _encode(insns: list[iced_x86.Instruction], address: int) -> bytes:
    if not insns:
        return b""
    enc = iced_x86.BlockEncoder(64)
    enc.add_many(insns)
    try:
        return bytes(enc.encode(address))
    except (ValueError, OverflowError) as exc:
        raise RelocationError(f"iced could not encode the window at {address:#x}: {exc}") \
            from exc


def _decode(code: bytes, address: int) -> list[iced_x86.Instruction]:
    dec = iced_x86.Decoder(64, code, ip=address)
    out = list(dec)
    if any(i.is_invalid for i in out):
        raise RelocationError(f"window bytes at {address:#x} do not decode")
    return out


def _same(orig: CodeInsn, new: CodeInsn) -> str | None:
    """None when `new` does what `orig` does at its new address, else the difference."""
    if orig.base_mnemonic != new.base_mnemonic and not (
        orig.target is not None and new.target is not None
    ):
        return f"{orig.text!r} became {new.text!r}"
    if orig.target is not None or new.target is not None:
        if orig.target != new.target:
            return f"branch target of {orig.text!r} moved to {new.target}"
        if orig.base_mnemonic.rstrip("q") != new.base_mnemonic.rstrip("q"):
            return f"branch {orig.text!r} became {new.text!r}"
        return None
    if orig.rip_target is not None or new.rip_target is not None:
        if orig.rip_target != new.rip_target:
            return f"rip-relative target of {orig.text!r} moved"
        return None
    if orig.op_str != new.op_str:
        return f"{orig.text!r} became {new.text!r}"
    return None


def _prefixes(raw: bytes) -> bytes:
    n = 0
    while n < len(raw) and raw[n] in _LEGACY_PREFIXES:
        n += 1
    return raw[:n]


def _check_part(orig: tuple[CodeInsn, ...], orig_code: bytes, orig_start: int, code: bytes,
                address: int, inner: dict[int, int] | None = None) -> list[CodeInsn]:
    new = sweep(code, address)
    if new.bad:
        raise RelocationError(f"relocated bytes at {new.bad[0]:#x} do not decode")
    if len(new.insns) != len(orig):
        raise RelocationError(f"relocation turned {len(orig)} instructions into "
                              f"{len(new.insns)}")
    for o, n in zip(orig, new.insns, strict=True):
        raw = code[n.address - address : n.end - address]
        old = orig_code[o.address - orig_start : o.end - orig_start]
        if 0x67 in _prefixes(raw) and 0x67 not in _prefixes(old):
            raise RelocationError(f"{o.text!r} came out with a 67 address-size prefix")
        if raw[:2] == b"\xff\x25" and old[:2] != b"\xff\x25":
            raise RelocationError(f"{o.text!r} came out as an absolute jmp [rip] (out of "
                                  f"reach)")
        want = o
        if inner and o.target is not None and o.target in inner:
            want = o._replace(target=inner[o.target])  # an inner branch: its target moved
        diff = _same(want, n)
        if diff:
            raise RelocationError(diff)
    return list(new.insns)


@dataclass(frozen=True, slots=True)
class Replacement:
    """A probe instruction of the window and the site bytes that take its place."""

    address: int
    length: int
    site: bytes


def relocate_window(window_code: bytes, start: int, replacements: list[Replacement],
                    address: int, emulate: frozenset[int] = frozenset()) -> Detour:
    """Relocate the window [start, start + len(window_code)) to `address`.

    Each replaced instruction (a probe) is swapped for its site bytes; every other instruction
    is re-encoded by iced and checked. The detour ends with a jump back to the window's end.
    `Detour.probe_address` is where the first replacement's bytes start; `insn_map` maps every
    original instruction (probes included) to its place in the detour.
    """
    end = start + len(window_code)
    if not (address >= 0 and address + MAX_DETOUR_BYTES <= ADDRESS_LIMIT
            and start >= 0 and end <= ADDRESS_LIMIT):
        raise RelocationError(f"a detour at {address:#x} for the window at {start:#x} would run "
                              f"past the end of the 64-bit address space")
    original = sweep(window_code, start)
    if original.bad:
        raise RelocationError(f"window bytes at {original.bad[0]:#x} do not decode")
    iced = _decode(window_code, start)
    if len(iced) != len(original.insns):
        raise RelocationError("capstone and iced split the window differently")
    by_addr = {r.address: r for r in replacements}
    for r in replacements:
        match = [i for i in iced if i.ip == r.address]
        if len(match) != 1 or match[0].len != r.length:
            raise RelocationError(f"no {r.length}-byte instruction at {r.address:#x}")
    # original addresses of the window's instructions a branch of the window targets, other
    # than the start: their copies in the detour are the real targets
    inner_targets = {o.target for o in original.insns if o.target is not None and
                     start < o.target < end} & {o.address for o in original.insns}
    # the first layout aims them at the detour's start, not at their original addresses:
    # iced's block encoder moves a branch to an instruction of the same block with it, so an
    # inner branch aimed at its original address (say a loop after the probe) would come out
    # moved while the check expects it unmoved (tests/test_fuzz_programs.py)
    inner: dict[int, int] = dict.fromkeys(inner_targets, address)
    for _ in range(8):
        detour = _layout(window_code, start, end, original.insns, iced, by_addr, address,
                         inner, emulate)
        placed = {o: n for o, n in detour.insn_map if o in inner_targets}
        if placed == inner:
            return detour
        inner = placed
    raise RelocationError(f"the inner branches of the window at {start:#x} do not settle")


def _layout(window_code: bytes, start: int, end: int, insns: tuple[CodeInsn, ...],
            iced: list[iced_x86.Instruction], by_addr: dict[int, Replacement], address: int,
            inner: dict[int, int], emulate: frozenset[int] = frozenset()) -> Detour:
    """One layout of the detour, with the inner branches aimed at `inner` (original address
    -> detour address; empty on the first pass)."""
    out = bytearray()
    pairs: list[tuple[int, int]] = []
    first_site: int | None = None
    run_iced: list[iced_x86.Instruction] = []
    run_orig: list[CodeInsn] = []

    def flush_run(final_jump: bool) -> None:
        at = address + len(out)
        instrs = []
        for ins in run_iced:
            if ins.op_count and ins.op0_kind == iced_x86.OpKind.NEAR_BRANCH64 and \
                    ins.near_branch64 in inner:
                moved = ins.copy()
                moved.near_branch64 = inner[ins.near_branch64]
                instrs.append(moved)
            else:
                instrs.append(ins)
        if final_jump:
            instrs.append(iced_x86.Instruction.create_branch(iced_x86.Code.JMP_REL32_64, end))
        code = _encode(instrs, at)
        if final_jump:
            tail = sweep(code, at)
            if tail.bad or not tail.insns:
                raise RelocationError("the detour's tail does not decode")
            jmp = tail.insns[-1]
            if jmp.target != end or jmp.base_mnemonic not in ("jmp", "jmpq"):
                raise RelocationError(f"the detour does not end with jmp {end:#x}")
            body = code[: jmp.address - at]
        else:
            body = code
        new = _check_part(tuple(run_orig), window_code, start, body, at, inner)
        pairs.extend((o.address, n.address) for o, n in zip(run_orig, new, strict=True))
        if final_jump:
            pairs.append((end, at + len(body)))
        out.extend(code)
        run_iced.clear()
        run_orig.clear()

    for ins, orig in zip(iced, insns, strict=True):
        if ins.ip in emulate:
            flush_run(False)
            at = address + len(out)
            pairs.append((ins.ip, at))
            out.extend(emulated_call(ins, orig, at, end))
            continue
        rep = by_addr.get(ins.ip)
        if rep is None:
            run_iced.append(ins)
            run_orig.append(orig)
            continue
        flush_run(False)
        at = address + len(out)
        if first_site is None:
            first_site = at
        pairs.append((rep.address, at))
        out.extend(rep.site)
    flush_run(True)
    if first_site is None:
        raise RelocationError("no probe to replace in the window")
    site_len = len(by_addr[min(by_addr)].site)
    return Detour(address=address, code=bytes(out), probe_address=first_site, site_length=site_len,
                  insn_map=tuple(pairs))


def emulated_call(ins: iced_x86.Instruction, orig: CodeInsn, at: int, end: int) -> bytes:
    """`push %rax; lea RET(%rip),%rax; xchg %rax,(%rsp); jmp TARGET` at `at` for the call
    `ins`, which must be the window's last instruction (its return address is `end`)."""
    if orig.end != end:
        raise RelocationError(f"the call at {orig.address:#x} is not the window's last "
                              f"instruction: it cannot be emulated")
    rax, rsp = iced_x86.Register.RAX, iced_x86.Register.RSP
    seq = [iced_x86.Instruction.create_reg(iced_x86.Code.PUSH_R64, rax),
           iced_x86.Instruction.create_reg_mem(iced_x86.Code.LEA_R64_M, rax,
                                               iced_x86.MemoryOperand(iced_x86.Register.RIP,
                                                                      displ=end)),
           iced_x86.Instruction.create_mem_reg(iced_x86.Code.XCHG_RM64_R64,
                                               iced_x86.MemoryOperand(rsp), rax)]
    if ins.code == iced_x86.Code.CALL_REL32_64:
        jmp = iced_x86.Instruction.create_branch(iced_x86.Code.JMP_REL32_64, ins.near_branch64)
    elif ins.code == iced_x86.Code.CALL_RM64:
        jmp = ins.copy()
        jmp.code = iced_x86.Code.JMP_RM64
        if jmp.op0_kind == iced_x86.OpKind.MEMORY:
            if jmp.memory_index == rsp:
                raise RelocationError(f"the call at {orig.address:#x} cannot be emulated")
            if jmp.memory_base == rsp:
                jmp.memory_displacement = (jmp.memory_displacement + 8) & 0xFFFFFFFFFFFFFFFF
        elif jmp.op0_register == rsp:
            raise RelocationError(f"the call at {orig.address:#x} cannot be emulated")
    else:
        raise RelocationError(f"the call at {orig.address:#x} ({orig.text}) cannot be "
                              f"emulated")
    code = _encode([*seq, jmp], at)
    got = sweep(code, at)
    names = [i.base_mnemonic.rstrip("q") for i in got.insns]
    if got.bad or names != ["push", "lea", "xchg", "jmp"] or got.insns[1].rip_target != end \
            or (orig.target is not None and got.insns[3].target != orig.target):
        raise RelocationError(f"the emulated call at {orig.address:#x} did not encode as "
                              f"expected ({names})")
    return code


def jmp_rel32(source: int, target: int) -> bytes:
    """`e9 rel32`: jmp from `source` to `target` (5 bytes)."""
    rel = target - (source + 5)
    if not INT32_MIN <= rel <= INT32_MAX:
        raise RelocationError(f"jmp from {source:#x} to {target:#x} is out of rel32 reach")
    return b"\xe9" + rel.to_bytes(4, "little", signed=True)


def jmp_rel8(source: int, target: int) -> bytes:
    """`eb rel8`: jmp from `source` to `target` (2 bytes)."""
    rel = target - (source + 2)
    if not -128 <= rel <= 127:
        raise RelocationError(f"jmp from {source:#x} to {target:#x} is out of rel8 reach")
    return b"\xeb" + rel.to_bytes(1, "little", signed=True)


# Intel's recommended multi-byte NOPs (SDM vol. 2B, "NOP"), the fill of a re-laid window
_FILL = (b"", b"\x90", b"\x66\x90", b"\x0f\x1f\x00", b"\x0f\x1f\x40\x00",
         b"\x0f\x1f\x44\x00\x00", b"\x66\x0f\x1f\x44\x00\x00",
         b"\x0f\x1f\x80\x00\x00\x00\x00", b"\x0f\x1f\x84\x00\x00\x00\x00\x00")


def nop_fill(size: int) -> bytes:
    """`size` bytes of NOPs, as few instructions as the recommended forms allow."""
    out = b""
    while size > 0:
        n = min(size, len(_FILL) - 1)
        out += _FILL[n]
        size -= n
    return out


def relay_window(window_code: bytes, start: int, probe_length: int, site: bytes,
                 anchors: frozenset[int] = frozenset(),
                 decoded: tuple[CodeInsn, ...] = ()) -> Detour:
    """The window [start, start + len(window_code)) re-laid where it is: its first
    instruction (the probe, `probe_length` bytes) becomes `site`, the others are re-encoded
    by iced, and NOPs fill what their shorter encodings free. Every address of `anchors`
    strictly inside the window (a call's return address, a row boundary of the unwind
    table) starts the same original instruction afterwards, and the instructions before it
    end there: each stretch between anchors is laid out as `[site] fill instructions`, its
    instructions ending where the stretch ends. RelocationError when the stretch does not
    fit or the output does not decode back to the same instructions. The result is a Detour
    at `start` of exactly the window's length; its insn_map ends with (end, end).
    `decoded`: the window's instructions as a sweep of its function decoded them, used
    when they tile the window exactly (a linear sweep of the same bytes from the same
    boundary is the same instructions); else the window is swept here."""
    end = start + len(window_code)
    if decoded and decoded[0].address == start and decoded[-1].end == end and all(
            a.end == b.address for a, b in pairwise(decoded)):
        original = Sweep(start, end, decoded, ())
    else:
        original = sweep(window_code, start)
    if original.bad:
        raise RelocationError(f"window bytes at {original.bad[0]:#x} do not decode")
    iced = _decode(window_code, start)
    if len(iced) != len(original.insns) or not iced or iced[0].len != probe_length:
        raise RelocationError(f"no {probe_length}-byte probe instruction at {start:#x}")
    starts = {i.address for i in original.insns}
    cuts = sorted(a for a in anchors if start < a < end)
    if any(a not in starts for a in cuts):
        raise RelocationError("an address that must stay put is inside an instruction")
    out = bytearray(site)
    pairs: list[tuple[int, int]] = [(start, start)]
    k = 1
    for cut in [*cuts, end]:
        run = [(o, i) for o, i in zip(original.insns[k:], iced[k:], strict=True)
               if o.address < cut]
        k += len(run)
        lo = start + len(out)
        body, at = _encode_ending_at([i for _o, i in run], cut, lo)
        if at < lo:
            raise RelocationError(f"the instructions before {cut:#x} do not fit in their "
                                  f"{cut - lo} bytes re-encoded ({len(body)} bytes)")
        fill = nop_fill(at - lo)
        new = _check_part(tuple(o for o, _i in run), window_code, start, body, at)
        pairs.extend((o.address, n.address) for (o, _i), n in zip(run, new, strict=True))
        out += fill + body
    if len(out) != len(window_code):
        raise RelocationError("the re-laid window is not the window's length")
    return Detour(address=start, code=bytes(out), probe_address=start, site_length=len(site),
                  insn_map=(*pairs, (end, end)))


def _encode_ending_at(insns: list[iced_x86.Instruction], end: int, lo: int
                      ) -> tuple[bytes, int]:
    """`insns` encoded so that they end at `end`: (bytes, their address); the address may
    fall below `lo` (then they do not fit)."""
    size = len(_encode(insns, lo))
    for _ in range(6):
        at = end - size
        if at < lo:
            return b"", at
        code = _encode(insns, at)
        if len(code) == size:
            return code, at
        size = len(code)
    raise RelocationError(f"the instructions before {end:#x} do not settle")
