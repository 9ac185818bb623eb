"""Patch windows: where a probe site that the kernel will not optimize can be given a nop5.

Reference: shared/design/usdt-and-rewriting.md ("What follows a 1-byte probe nop"). A window is
a run of whole instructions [start, end) of one function that holds the probe instruction and
is at least 5 bytes long, with no branch target strictly inside it (one at `start` is fine) and
no `call` in it (a relocated call would push a return address inside the detour, which breaks
unwinding and return-address based tools). Three shapes, tried in this order:

1. IN_PLACE: the probe and the bytes after it are NOPs (NOP padding, `nop; nop5`, DTrace -G's
   five 1-byte nops, a hint or DS-prefixed NOP): write the canonical nop5 over
   [probe, probe + 5) and single-byte nops up to `end`. Nothing moves; no run-time cost.
2. FORWARD: start at the probe and take the instructions after it until 5 bytes are covered.
3. BACKWARD: start at an instruction before the probe, and extend past the probe only as far as
   needed; the window with the fewest relocated bytes wins.

For FORWARD and BACKWARD the rewriter writes `jmp rel32` to a detour at `start`, fills
[start + 5, end) with int3, and puts the relocated instructions in the detour (the probe
instruction replaced by the new probe form) followed by `jmp end`: two extra jumps per pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from usdtpatch.sites.targets import JUMP, FunctionCode, Target
from usdtpatch.x86.decode import CodeInsn, Flow
from usdtpatch.x86.nops import NOP1, NOP5, crosses_page, decode_nop

JMP_REL32_SIZE = 5  # e9 rel32: jmp to the detour
MAX_BACKWARD_INSNS = 8  # instructions before the probe a backward window may start at
MAX_WINDOW = 64  # bytes: a window never grows beyond this
PAGE = 4096


class WindowShape(Enum):
    IN_PLACE = "in-place"
    FORWARD = "forward"
    BACKWARD = "backward"


@dataclass(frozen=True, slots=True)
class PatchWindow:
    """Where and how one probe site can be rewritten so that the kernel optimizes it.

    Fields, for a rewriter:
    - `start`, `end`: link-time addresses of the window [start, end); whole instructions of one
      function; `end - start >= 5` (FORWARD/BACKWARD) or the NOP run rewritten (IN_PLACE).
      Exception: when the function ends with `ret`/`jmp` before 5 bytes, `end` may lie inside
      the unused alignment padding after it (`padding_bytes` > 0, `end_reason` says so):
      `insns` and `code` then stop at the function's end, `padding_bytes` before `end`; the
      padding is overwritten (jmp + int3) but never relocated (no one executes it).
    - `insns`: the instructions in [start, end), in order, as decoded (address, size, mnemonic,
      op_str, flow, rip_target). `code` holds their original bytes (`code[i.address - start:
      i.end - start]` is instruction i; `len(code) == end - start - padding_bytes`). For a
      detour, relocate exactly these; replace the one at `probe_address` (`probe_length`
      bytes) with the new probe form.
    - `probe_address`, `probe_offset` (= probe_address - start), `probe_length`: the probe
      instruction inside the window; after a detour the note's pc must point at its copy.
      It is a NOP for every site sys/sdt.h or usdt.h emits; if a hand-written note points at
      another instruction, keep that instruction and put the new probe form before it.
    - `shape`: IN_PLACE (write `replacement` at `start`; no detour), FORWARD or BACKWARD (write
      `jmp rel32` at `start`, int3 over [start + 5, end), detour = relocated `insns` + `jmp end`).
    - `replacement`: for IN_PLACE, the bytes to write over [start, end) (nop5, then 1-byte
      nops); None otherwise.
    - `relocated_bytes`: bytes moved to a detour (0 in place); the optimization criterion.
    - `extra_jumps`: run-time cost per pass when not traced (0 in place, 2 with a detour).
    - `start_reason`, `end_reason`: why the window starts and ends where it does (shown by
      `show`); `targets_at_start`: branch targets at `start` (allowed there: the jmp lands them
      on the detour).
    - `internal_targets`: branch targets strictly inside the window that are reached only by
      direct jumps that are themselves inside it. Relocating the window as one block (iced's
      BlockEncoder does) makes those jumps land on the relocated copies: the rewriter must
      relocate `insns` together and keep intra-window branches pointing inside the detour.
    - `function_start`, `function_end`: bounds of the containing function (or part).
    """

    shape: WindowShape
    start: int
    end: int
    probe_address: int
    probe_length: int
    insns: tuple[CodeInsn, ...]
    code: bytes
    replacement: bytes | None
    relocated_bytes: int
    extra_jumps: int
    start_reason: str
    end_reason: str
    targets_at_start: tuple[Target, ...]
    internal_targets: tuple[int, ...]
    function_start: int
    function_end: int
    padding_bytes: int = 0  # bytes of unused padding after the function at the window's end

    @property
    def probe_offset(self) -> int:
        return self.probe_address - self.start

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class WindowResult:
    """The best window, or why there is none (`code` is a finding code)."""

    window: PatchWindow | None
    code: str | None  # e.g. "window-branch-target" when blocked
    reason: str  # the blocking detail, or a one-line description of the window
    tried: tuple[str, ...]  # what each shape said, for `show` and the JSON report


class _Blocked(Exception):
    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _describe_target(t: Target) -> str:
    src = f" from {t.source:#x}" if t.source is not None else ""
    return f"{t.kind}{src}"


def find_window(fc: FunctionCode, probe_address: int, code: bytes) -> WindowResult:
    """The best patch window for the probe instruction at `probe_address` in function `fc`.

    `code` is the function's bytes (fc.bounds.start .. fc.bounds.end), used for the window's
    `code` and for recognizing NOP padding.
    """
    i = fc.index_of(probe_address)
    if i is None:
        covering = fc.index_covering(probe_address)
        why = ("it is inside the instruction at "
               f"{fc.insns[covering].address:#x}") if covering is not None else "no instruction"
        return WindowResult(None, "probe-not-decoded",
                            f"the probe at {probe_address:#x} is not an instruction boundary of "
                            f"the function's linear disassembly ({why})", ())
    tried: list[str] = []
    try:
        w = _in_place(fc, i, code)
        return WindowResult(w, None, f"in place: nop5 over [{w.start:#x}, {w.end:#x})",
                            ("in-place: ok",))
    except _Blocked as b:
        tried.append(f"in-place: {b.reason}")
    forward_block: _Blocked | None = None
    try:
        w = _forward(fc, i, code)
        return WindowResult(w, None, f"forward: {w.relocated_bytes} bytes relocated",
                            (*tried, "forward: ok"))
    except _Blocked as b:
        forward_block = b
        tried.append(f"forward: {b.reason}")
    try:
        w = _backward(fc, i, code)
        return WindowResult(w, None, f"backward: {w.relocated_bytes} bytes relocated",
                            (*tried, "backward: ok"))
    except _Blocked as b:
        tried.append(f"backward: {b.reason}")
        primary = forward_block if forward_block is not None else b
        if fc.all_targets is not None:
            return WindowResult(None, "window-all-targets",
                                f"every instruction counts as a branch target: {fc.all_targets}",
                                tuple(tried))
        return WindowResult(None, primary.code, "; ".join(tried[1:]), tuple(tried))


def _window(fc: FunctionCode, shape: WindowShape, s: int, e: int, probe: CodeInsn,
            code: bytes, replacement: bytes | None, start_reason: str,
            end_reason: str, internal: tuple[int, ...] = ()) -> PatchWindow:
    insns = tuple(fc.insns[fc.index_of(s) or 0: (fc.index_of(e) if fc.index_of(e) is not None
                                                  else len(fc.insns))])
    base = fc.bounds.start
    at_start = fc.target(s)
    padding = max(0, e - fc.bounds.end) if shape is not WindowShape.IN_PLACE else 0
    return PatchWindow(
        shape=shape, start=s, end=e, probe_address=probe.address, probe_length=probe.size,
        insns=insns, code=code[s - base: e - padding - base], replacement=replacement,
        relocated_bytes=0 if shape is WindowShape.IN_PLACE else e - s,
        extra_jumps=0 if shape is WindowShape.IN_PLACE else 2,
        start_reason=start_reason, end_reason=end_reason,
        targets_at_start=(at_start,) if at_start is not None else (),
        internal_targets=internal,
        function_start=fc.bounds.start, function_end=fc.bounds.end, padding_bytes=padding)


def _in_place(fc: FunctionCode, i: int, code: bytes) -> PatchWindow:
    probe = fc.insns[i]
    s = probe.address
    if crosses_page(s, 5):
        raise _Blocked("site-crosses-page", f"a nop5 at {s:#x} would cross a page")
    base = fc.bounds.start
    j = i
    e = s
    while e - s < JMP_REL32_SIZE:
        if j >= len(fc.insns):
            raise _Blocked("window-function-end", "the NOP run reaches the function's end")
        ins = fc.insns[j]
        if decode_nop(code[ins.address - base: ins.end - base]) is None:
            raise _Blocked("window-no-padding",
                           f"{ins.text} at {ins.address:#x} is not a NOP"
                           if j > i else "the probe instruction is not a NOP")
        e = ins.end
        j += 1
    inside = fc.targets_between(s, s + JMP_REL32_SIZE)
    if fc.all_targets is not None:
        inside += [a for a in fc.starts if s < a < s + JMP_REL32_SIZE]
    if inside:
        t = fc.target(inside[0])
        raise _Blocked("window-branch-target",
                       f"{inside[0]:#x} inside the new nop5 is a branch target "
                       f"({_describe_target(t) if t else 'inside an instruction'})")
    repl = NOP5 + NOP1 * (e - s - JMP_REL32_SIZE)  # nopl 0x0(%rax,%rax,1); nop...
    return _window(fc, WindowShape.IN_PLACE, s, e, probe, code, repl,
                   "the probe instruction", f"end of the NOP run covering 5 bytes ({e - s})")


def _is_call(ins: CodeInsn) -> bool:
    return ins.flow in (Flow.CALL, Flow.CALL_INDIRECT)


def _interior(fc: FunctionCode, s: int, e: int, first: int, last: int) -> tuple[
        bool, bool, str, tuple[int, ...]]:
    """Check the targets strictly inside [s, e) (instructions first+1 .. last).

    Returns (ok, fixable, reason, internal targets). A target is allowed inside when every
    way to reach it is a direct jump that is itself inside the window: the relocated copy of
    that jump then lands on the relocated copy of the target. `fixable` is True when a later
    `e` could still make the window valid (every offending source lies after `e`).
    """
    internal: list[int] = []
    if fc.all_targets is not None and last > first:
        ins = fc.insns[first + 1]
        return False, False, (f"{ins.address:#x} ({ins.text}) counts as a branch target "
                              f"({fc.all_targets})"), ()
    for addr in fc.targets_between(s, e):
        t = fc.targets[addr]
        k = fc.index_of(addr)
        text = fc.insns[k].text if k is not None else "inside an instruction"
        why = f"{addr:#x} ({text}) is a branch target ({_describe_target(t)})"
        sources = fc.incoming.get(addr, ())
        if k is None or not sources:
            return False, False, why, ()
        later = False
        for src in sources:
            if src.kind != JUMP or src.source is None:
                return False, False, why, ()
            if s <= src.source < e:
                continue
            if e <= src.source < fc.bounds.end:
                later = True
                continue
            return False, False, why, ()
        if later:
            return False, True, why, ()
        internal.append(addr)
    return True, False, "", tuple(internal)


def _span(fc: FunctionCode, first: int, i: int) -> tuple[int, str, tuple[int, ...]]:
    """The smallest valid end for a window starting at instruction `first` and holding
    instruction i: (end, why it ends there, targets inside reached only from inside)."""
    insns = fc.insns
    s = insns[first].address
    for k in range(first, i + 1):
        if _is_call(insns[k]):
            raise _Blocked("window-call", f"{insns[k].address:#x} is a call ({insns[k].text})")
    last_block: _Blocked | None = None
    j = i
    while True:
        e = insns[j].end
        if e - s >= JMP_REL32_SIZE:
            ok, fixable, why, internal = _interior(fc, s, e, first, j)
            if ok:
                nxt = fc.target(e)
                reason = f"5 bytes covered ({e - s})"
                if internal:
                    reason += (f"; {len(internal)} target(s) inside are reached only from "
                               "inside the window")
                if nxt is not None:
                    reason += f"; {e:#x} is a branch target ({nxt.kind})"
                return e, reason, internal
            last_block = _Blocked("window-branch-target", why)
            if not fixable:
                raise last_block
        j += 1
        if j >= len(insns) or insns[j].address >= fc.bounds.end:
            last = insns[j - 1]
            need = s + JMP_REL32_SIZE - e
            if (0 < need <= fc.padding_after and e == fc.bounds.end
                    and last.flow in (Flow.RET, Flow.JMP, Flow.JMP_INDIRECT, Flow.STOP)):
                ok, _fixable, why, internal = _interior(fc, s, e, first, j - 1)
                if ok:
                    return s + JMP_REL32_SIZE, (
                        f"the function ends at {e:#x} after {last.text}; {need} byte(s) of "
                        "the alignment padding after it complete 5 bytes"), internal
            raise last_block or _Blocked(
                "window-function-end", f"the function ends at {fc.bounds.end:#x} before 5 "
                                       "bytes")
        if _is_call(insns[j]):
            raise last_block or _Blocked(
                "window-call", f"{insns[j].address:#x} is a call ({insns[j].text})")
        if insns[j].end - s > MAX_WINDOW:
            raise last_block or _Blocked("window-branch-target", "no end within "
                                                                 f"{MAX_WINDOW} bytes")


def _forward(fc: FunctionCode, i: int, code: bytes) -> PatchWindow:
    probe = fc.insns[i]
    e, why, internal = _span(fc, i, i)
    if probe.size >= JMP_REL32_SIZE:
        why = "the probe instruction alone is 5 bytes or more"
    return _window(fc, WindowShape.FORWARD, probe.address, e, probe, code, None,
                   "the probe instruction", why, internal)


def _backward(fc: FunctionCode, i: int, code: bytes) -> PatchWindow:
    probe = fc.insns[i]
    best: tuple[int, int, int, str, tuple[int, ...]] | None = None  # (size, -start, end, ..)
    first_block: _Blocked | None = None
    for k in range(i - 1, max(-1, i - 1 - MAX_BACKWARD_INSNS), -1):
        ins = fc.insns[k]
        # An unconditional jmp/ret may be inside: what follows it is reached only through
        # targets, which the analysis knows (or it says all-targets), or it is dead padding.
        if _is_call(ins):
            first_block = first_block or _Blocked(
                "window-call", f"{ins.address:#x} is a call ({ins.text})")
            break
        try:
            e, why, internal = _span(fc, k, i)
        except _Blocked as b:
            first_block = first_block or b
            continue
        cand = (e - ins.address, -ins.address, e, why, internal)
        if best is None or cand[:2] < best[:2]:
            best = cand
    if best is None:
        raise first_block or _Blocked("window-branch-target", "no start before the probe")
    s, e, why, internal = -best[1], best[2], best[3], best[4]
    t = fc.target(s)
    start_reason = (f"fewest relocated bytes; {s:#x} is a branch target ({t.kind})"
                    if t is not None else "fewest relocated bytes")
    return _window(fc, WindowShape.BACKWARD, s, e, probe, code, None, start_reason, why,
                   internal)
