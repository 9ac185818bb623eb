"""Re-laying a window where it is: the probe's nop becomes the new site at the note's pc,
and the instructions after it are re-encoded in their own bytes (docs/rewrite.md, "Re-laid
in place"). Nothing moves to a detour; the site costs what a native nop5 does.

`relay(ctx, probe, site)` is asked by check (analysis/check.py) and by the rewrite's plan
(rewriter/plan.py) alike, so that check predicts what rewrite does. The window is the
straight run of whole instructions from the probe, the shortest that fits; the rules (each
refusal says which):

- the probe instruction starts the window, and the new site there is optimized by the
  kernel where it is (analysis/rules.optimized_where_it_is);
- no way in strictly inside the window (the function's targets, the file-wide ways in
  included), but the return site of a call inside it: nothing is retargeted;
- every address that must stay put stays put: each call's return address (the unwind row
  and the LSDA call-site entry looked up at return address - 1 are then the same), each
  boundary of an `.eh_frame` row inside the window (the instructions between two such
  addresses run with the row the original's ran with; NOP fill changes no state), and,
  where an instruction of the window can fault, each boundary of an LSDA call-site entry
  (a fault is looked up at the instruction's own address: it stays in its entry);
- no `.debug_frame` in the file (it is not read, so its rows cannot be kept), no relocation
  whose place lies in the window, no call into the window;
- the window ends at the first target, or after an instruction that does not fall through.
The red-zone guard, several probes in one window and the argument rules are the callers'
(they are the detours' too).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from usdtpatch.analysis.calls import may_fault
from usdtpatch.analysis.probes import Probe
from usdtpatch.analysis.rules import optimized_where_it_is
from usdtpatch.analysis.targets import RETURN_SITE, CodeContext, FunctionCode
from usdtpatch.analysis.windows import MAX_WINDOW, PatchWindow, WindowShape
from usdtpatch.elf.cfi import CfiError, parse_lsda
from usdtpatch.elf.ehframe import Row, rows_at
from usdtpatch.elf.image import SHT_RELA, ElfImage
from usdtpatch.elf.model import fixed_place_in
from usdtpatch.elf.relocs import rela_table
from usdtpatch.errors import UnsupportedError
from usdtpatch.kernelfacts import DEFAULT, Generation
from usdtpatch.x86.decode import CodeInsn, Flow
from usdtpatch.x86.nops import decode_nop
from usdtpatch.x86.relocate import Detour, RelocationError, relay_window

_ENDS = (Flow.JMP, Flow.JMP_INDIRECT, Flow.RET, Flow.STOP)
_CALLS = (Flow.CALL, Flow.CALL_INDIRECT)


@dataclass(frozen=True, slots=True)
class Relaid:
    """A re-laid window: the PatchWindow (shape RELAID, `replacement` its new bytes) and the
    same bytes as a Detour at the window's start (what the verifiers compare)."""

    window: PatchWindow
    code: Detour


def relay(ctx: CodeContext, probe: Probe, site: bytes, optimized_offset: int, *,
          gen: Generation = DEFAULT) -> Relaid | str:
    """The probe's window re-laid with `site` at its pc, or why it cannot be."""
    pc = probe.address
    if not optimized_where_it_is(site[optimized_offset:], pc + optimized_offset, gen):
        return "the new site would not be optimized at the probe's address"
    image = ctx.image
    if image.section(".debug_frame") is not None:
        return "the file has .debug_frame, whose rows usdtpatch does not read"
    bounds = ctx.bounds(pc)
    fc = ctx.function(bounds) if bounds is not None else None
    if fc is None or fc.all_targets is not None:
        return "the function's ways in are not all known"
    i = fc.index_of(pc)
    if i is None:
        return "the probe is not an instruction boundary"
    if decode_nop(bytes(image.read_vaddr(pc, fc.insns[i].size))) is None:
        return "the probe instruction is not a NOP"
    last_why = "no straight run after the probe"
    rows: dict[int, dict[int, Row] | None] = {}  # each tried window reads a prefix of these
    for j in range(i + 1, len(fc.insns)):
        prev, ins = fc.insns[j - 1], fc.insns[j]
        if prev.flow in _ENDS or ins.end > fc.bounds.end or ins.end - pc > MAX_WINDOW:
            break
        if not _only_returns(fc, ins.address, pc):
            break  # a way in: the window ends before it
        got = _try(ctx, fc, i, j, site, rows)
        if isinstance(got, Relaid):
            return got
        last_why = got
    return last_why


def _only_returns(fc: FunctionCode, address: int, start: int) -> bool:
    """Whether every way into `address` is the return of a call in [start, address)."""
    if fc.target(address) is None:
        return True
    return all(t.kind == RETURN_SITE and t.source is not None and start <= t.source < address
               for t in fc.incoming.get(address, ()))


def _try(ctx: CodeContext, fc: FunctionCode, i: int, j: int, site: bytes,
         rows: dict[int, dict[int, Row] | None] | None = None) -> Relaid | str:
    insns = fc.insns[i : j + 1]
    s, e = insns[0].address, insns[-1].end
    if fc.targets_between(s, e) and any(not _only_returns(fc, a, s)
                                        for a in fc.targets_between(s, e)):
        return f"a way into [{s:#x}, {e:#x}) lies strictly inside it"
    for c in insns:
        if c.flow in _CALLS and c.target is not None and s <= c.target < e:
            return f"the call at {c.address:#x} calls into the window"
    if _relocated_place(ctx.image, s, e):
        return f"a relocation's place lies in [{s:#x}, {e:#x})"
    anchors = _row_boundaries(ctx, insns, rows)
    if isinstance(anchors, str):
        return anchors
    call_sites = call_site_boundaries(ctx, insns)
    if isinstance(call_sites, str):
        return call_sites
    anchors |= call_sites
    anchors |= {c.end for c in insns if c.flow in _CALLS}
    code = bytes(ctx.image.read_vaddr(s, e - s))
    try:
        laid = relay_window(code, s, insns[0].size, site, frozenset(anchors), insns)
    except RelocationError as exc:
        return str(exc)
    target = fc.target(s)
    win = PatchWindow(
        shape=WindowShape.RELAID, start=s, end=e, probe_address=s, probe_length=insns[0].size,
        insns=tuple(insns), code=code, replacement=laid.code, relocated_bytes=0,
        extra_jumps=0, start_reason="the probe instruction",
        end_reason=f"{len(insns) - 1} instruction(s) after the probe re-encoded shorter "
                   f"free the new site's bytes ({e - s})",
        targets_at_start=(target,) if target is not None else (), internal_targets=(),
        function_start=fc.bounds.start, function_end=fc.bounds.end,
        calls=tuple(c.address for c in insns if c.flow in _CALLS))
    return Relaid(win, laid)


def _row_boundaries(ctx: CodeContext, insns: tuple[CodeInsn, ...],
                    memo: dict[int, dict[int, Row] | None] | None = None) -> set[int] | str:
    """The addresses strictly inside the window where the `.eh_frame` row changes (each must
    be an instruction start), or why they cannot be known. `memo` (one per probe: every
    window tried starts at it) keeps the rows of the FDE from the window's start to
    MAX_WINDOW bytes on, read once: the row at an address does not depend on which other
    addresses are asked (ehframe.rows_at), so a prefix of them is what the window alone
    reads; where the longer read is refused (an args_size disagreement further on), the
    window is read alone."""
    s, e = insns[0].address, insns[-1].end
    fde = ctx.cfi.lookup(s)
    if fde is None:
        return set()
    if not fde.contains(e - 1):
        return f"the window [{s:#x}, {e:#x}) runs past its FDE's end"
    rows = None
    if memo is not None:
        if fde.address not in memo:
            try:
                memo[fde.address] = rows_at(fde, list(range(s, min(fde.pc_end,
                                                                   s + MAX_WINDOW))))
            except UnsupportedError:
                memo[fde.address] = None
        rows = memo[fde.address]
    if rows is None or e - 1 not in rows:
        try:
            rows = rows_at(fde, list(range(s, e)))
        except UnsupportedError as exc:
            return f"the FDE at {fde.address:#x} cannot be replayed: {exc}"
    out = {a for a in range(s + 1, e) if rows[a] != rows[a - 1]}
    starts = {c.address for c in insns}
    if not out <= starts:
        return f"an unwind row changes inside an instruction of [{s:#x}, {e:#x})"
    return out


def call_site_boundaries(ctx: CodeContext, insns: tuple[CodeInsn, ...]) -> set[int] | str:
    """The addresses strictly inside the window where the function's LSDA call-site table
    changes entry, when an instruction of the window can fault (analysis/calls.may_fault):
    a fault is looked up at the faulting instruction's own address, so such an instruction
    must stay inside the entry it was in (each boundary stays put); or why it cannot."""
    if not any(may_fault(c) for c in insns[1:]):
        return set()
    s, e = insns[0].address, insns[-1].end
    fde = ctx.cfi.lookup(s)
    if fde is None or fde.lsda is None:
        return set()
    try:
        lsda = parse_lsda(ctx.image, fde.lsda, fde.pc_begin)
    except CfiError as exc:
        return f"the function's LSDA at {fde.lsda:#x} does not parse: {exc}"
    out = {a for c in lsda.call_sites for a in (c.start, c.end) if s < a < e}
    if not out <= {c.address for c in insns}:
        return f"a call-site entry of the LSDA changes inside an instruction of [{s:#x}, {e:#x})"
    return out


def _relocated_place(image: ElfImage, s: int, e: int) -> bool:
    """Whether a relocation of the file has its place in [s, e): one the loader applies
    (every table, usdtpatch.elf.model.fixed_place_in: its width counted), or an entry of any
    other SHT_RELA table (`--emit-relocs`' `.rela.text`)."""
    if fixed_place_in(image, s, e) is not None:
        return True
    places = image.derived.get("relay_places")
    if not isinstance(places, list):
        places = sorted(r for sec in image.sections if sec.type == SHT_RELA
                        for _at, r, _t, _a in rela_table(image, sec.offset, sec.size))
        image.derived["relay_places"] = places
    k = bisect_left(places, s)
    return k < len(places) and places[k] < e
