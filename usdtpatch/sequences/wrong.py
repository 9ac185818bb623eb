"""Seven wrong write sequences that `usdtpatch verify` must reject, each with the reason
(failure code) it must name. They are built from a correct site plan of a generation whose
optimized site is the call alone (the nop5 generation's), so that they are wrong in exactly one
way; tests, docs/plan-verify.md and the benchmark use them.

Reference for what is right: usdtpatch.sequences.sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from usdtpatch.analysis.rules import rule
from usdtpatch.findings import (
    DISPLACEMENT_WITHOUT_INT3,
    NO_INT3_FIRST,
    OPCODE_BEFORE_DISPLACEMENT,
    SITE_CROSSES_PAGE,
    UNOPTIMIZE_LEAVES_CALL,
    WRITE_SPANS_BYTE0,
    WRONG_REL32,
)
from usdtpatch.kernelfacts import DEFAULT, Generation
from usdtpatch.sequences.plan import SitePlan
from usdtpatch.sequences.sequences import (
    CALL_REL32,
    INT3,
    SiteSequences,
    build_sequence,
    optimized_sequences,
)


@dataclass(frozen=True, slots=True)
class WrongSequence:
    name: str
    reason: str  # the failure code verify must report
    description: str
    site: SitePlan


def _with(site: SitePlan, seqs: SiteSequences) -> SitePlan:
    return replace(site, sequences=seqs)


def wrong_sequences(site: SitePlan) -> list[WrongSequence]:
    """The wrong variants of a correct, optimizable `site` whose optimized bytes are the call
    alone (all but page crossing, which needs a crossing site: see `crossing_site`)."""
    s = site.sequences
    gen = None if s is None else s.generation
    if s is None or gen is None or gen.call_offset or s.optimize is None \
            or s.trampoline is None or s.optimized is None or s.unoptimize is None:
        raise ValueError(f"{site.probe}: not an optimizable site whose optimized bytes are "
                         f"the call alone")
    a, orig, opt = s.address, s.original, s.optimized
    disp = opt[1:5]
    out: list[WrongSequence] = []

    seq = build_sequence("optimize", a, orig, [(0, opt, orig[0], "call written over the NOP")])
    out.append(WrongSequence(
        NO_INT3_FIRST.code, NO_INT3_FIRST.code,
        "optimize writes the 5-byte call straight over the NOP, without int3 first",
        _with(site, replace(s, optimize=seq, unoptimize=replace(s.unoptimize, start=opt)))))

    seq = build_sequence("optimize", a, orig, [
        (0, bytes([INT3]), orig[0], "int3 at byte 0"),
        (0, bytes([CALL_REL32]), INT3, "opcode e8 first"),
        (1, disp, CALL_REL32, "then rel32")])
    out.append(WrongSequence(
        OPCODE_BEFORE_DISPLACEMENT.code, OPCODE_BEFORE_DISPLACEMENT.code,
        "optimize writes the opcode e8 before the displacement",
        _with(site, replace(s, optimize=seq))))

    seq = build_sequence("optimize", a, orig, [
        (1, disp, orig[0], "rel32 while byte 0 is the NOP's"),
        (0, bytes([INT3]), orig[0], "int3 at byte 0"),
        (0, bytes([CALL_REL32]), INT3, "opcode e8")])
    out.append(WrongSequence(
        DISPLACEMENT_WITHOUT_INT3.code, DISPLACEMENT_WITHOUT_INT3.code,
        "optimize writes the displacement while byte 0 still holds the NOP's opcode",
        _with(site, replace(s, optimize=seq))))

    # rel32 measured from the site's start
    bad = optimized_sequences(gen, a, orig, s.trampoline + gen.nop_length)
    bad = replace(bad, trampoline=s.trampoline)
    out.append(WrongSequence(
        WRONG_REL32.code, WRONG_REL32.code,
        "rel32 computed from the site's start instead of its end (call lands 5 bytes into "
        "the trampoline)", _with(site, bad)))

    seq = build_sequence("unoptimize", a, opt, [
        (0, bytes([INT3]), CALL_REL32, "int3 over the call"),
        (1, orig[1:5], INT3, "restore bytes 1..4"),
        (0, bytes([CALL_REL32]), INT3, "byte 0 := e8 (should be the NOP's opcode)")])
    out.append(WrongSequence(
        UNOPTIMIZE_LEAVES_CALL.code, UNOPTIMIZE_LEAVES_CALL.code,
        "unoptimize puts e8 back at byte 0 instead of the NOP's first byte",
        _with(site, replace(s, unoptimize=seq))))

    seq = build_sequence("unoptimize", a, opt, [
        (0, bytes([INT3]), CALL_REL32, "int3 over the call"),
        (2, orig[2:5], INT3, "restore bytes 2..4"),
        (0, orig[0:2], INT3, "restore bytes 0..1 in one 2-byte write")])
    out.append(WrongSequence(
        WRITE_SPANS_BYTE0.code, WRITE_SPANS_BYTE0.code,
        "unoptimize restores bytes 0 and 1 with one 2-byte write",
        _with(site, replace(s, unoptimize=seq))))
    return out


def crossing_site(site: SitePlan, trampoline: int, gen: Generation = DEFAULT) -> WrongSequence:
    """A nop5 `site` that crosses a page, given the optimize sequences the kernel never
    writes for it (calling `trampoline`)."""
    s = site.sequences
    if s is None:
        raise ValueError(f"{site.probe}: no sequences")
    if rule(gen, s.original, site.address).code != SITE_CROSSES_PAGE.code:
        raise ValueError(f"{site.probe}: {site.address:#x} does not cross a page")
    return WrongSequence(SITE_CROSSES_PAGE.code, SITE_CROSSES_PAGE.code,
                         f"a nop{gen.nop_length} that crosses a page boundary, optimized anyway",
                         _with(site, optimized_sequences(gen, site.address, s.original,
                                                         trampoline)))
