"""Rewrite, step 1: decide every site. The result is a `RewritePlan`, frozen data.

The flow is one way: the probes and their check (patch windows, red-zone verdicts, from
usdtpatch.analysis.check) -> one `SiteDecision` per probe -> the detours laid out in the new
segment. Nothing here makes the output file: `usdtpatch.rewriter.build.build_rewrite(plan)` does,
and `rewrite --dry-run` prints a plan without building it.

Every detour is handed to the verifier (the emulator's equivalence check) before it is
accepted; a site whose detour fails is left as it was and reported. The verifier is a required
argument: a caller that skips verification says so with `verify=None`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import pairwise
from typing import Any

from usdtpatch import findings
from usdtpatch.analysis.calls import (
    CALL_CHOICES,
    CALLS_AUTO,
    EMULATED,
    MOVED,
    shadow_stack_marked,
)
from usdtpatch.analysis.calls import DetourEh as _DetourEh
from usdtpatch.analysis.calls import call_technique as _call_technique
from usdtpatch.analysis.check import CheckReport, SiteCheck, check
from usdtpatch.analysis.probes import (
    BASE_SECTION,
    Probe,
    ProbeSet,
    not_linked_message,
    read_probes,
)
from usdtpatch.analysis.rules import optimized_where_it_is
from usdtpatch.analysis.windows import (
    REL8_STUB,
    REL32,
    TABLE4,
    TABLE8,
    PatchWindow,
    Retarget,
    WindowShape,
)
from usdtpatch.elf.cfi import CfiIndex, Lsda, load_cfi
from usdtpatch.elf.ehframe import (
    RSP,
    LsdaRow,
    Personality,
    Row,
    build_detour_lsda,
    detour_call_sites,
    rows_at,
)
from usdtpatch.elf.image import EM_X86_64, ET_DYN, ET_EXEC, SHT_RELA, ElfImage, Section
from usdtpatch.elf.relocs import R_X86_64_RELATIVE, RelaTable
from usdtpatch.elf.writer import SegmentLayout, plan_segment
from usdtpatch.errors import UnsupportedError
from usdtpatch.findings import Finding
from usdtpatch.rewriter.forms import (
    ForkGuard,
    Form,
    Guard,
    SiteBytes,
    guard_args,
    site_bytes,
    uses_numeric_rip,
)
from usdtpatch.rewriter.index import Claims, SitesByAddress
from usdtpatch.rewriter.marker import AlreadyRewritten, marker_of
from usdtpatch.rewriter.merge import join_following
from usdtpatch.x86.decode import sweep
from usdtpatch.x86.nops import GUARD_ENTER, RED_ZONE, SiteForm, nop5_offset
from usdtpatch.x86.relocate import Detour, RelocationError, Replacement, jmp_rel32, relocate_window

INT3 = 0xCC

# verify(image, window, detour, replaced probe addresses) -> None when equivalent, else why.
# A window with ways in from outside (retargeted branches) is verified with two more keyword
# arguments: patches=((vaddr, bytes), ...) (the retargeted branch sources, table entries and
# stubs, as written) and entries=((original entry, rewritten entry), ...) (each way in, and
# each moved call's return site, run in both and compared).
Verifier = Callable[..., str | None]

# skip codes that mean "this site should have been rewritten and could not be"
FAILURE_CODES = findings.REWRITE_FAILURES


class Action(Enum):
    """What the rewrite does to one probe's site."""

    IN_PLACE = "in-place"  # the new form written over the NOPs that follow the site
    DETOUR = "detour"  # the window moved to a detour in the new segment
    MOVED = "moved"  # rewritten inside another site's window (and detour)
    SKIPPED = "skipped"  # left as it was; `code` says why


class Status(Enum):
    """The verdict on one site: rewritten, left alone on purpose, or a failure."""

    REWRITTEN = "rewritten"
    UNCHANGED = "unchanged"
    FAILED = "failed"


def sites_failed(sites: Iterable[SiteDecision]) -> bool:
    """Whether a site that should have been rewritten could not be: the one definition of a
    failed rewrite (RewritePlan.failed, api.RewriteOutcome.failed)."""
    return any(s.status is Status.FAILED for s in sites)


@dataclass(frozen=True, slots=True)
class SiteDecision:
    """The decision on one probe's site."""

    probe: Probe
    action: Action
    code: str | None  # why skipped (a finding code)
    reason: str
    new_pc: int | None
    window: PatchWindow | None
    detour: Detour | None
    guarded: bool
    extra_jumps: int
    # how the window's calls are handled: "moved" (they return into the detour) or
    # "emulated" (push the original return address, jmp); None without a call
    calls: str | None = None
    retargeted: tuple[str, ...] = ()  # the ways in aimed at the detour, described
    # how the detour was verified: "proved" (usdtpatch.prove), "emulated", "not verified"
    # (no verifier, or nothing moved: in place); None for a site skipped before any detour
    verification: str | None = None

    @property
    def status(self) -> Status:
        if self.action is not Action.SKIPPED:
            return Status.REWRITTEN
        return Status.FAILED if self.code in FAILURE_CODES else Status.UNCHANGED


# Kept for older imports: a site's outcome is its decision.
SiteOutcome = SiteDecision


@dataclass(frozen=True, slots=True)
class DetourUnwind:
    """A detour and its unwind rows (new address, row), from the FDE of its window; with
    `lsda` (the address of the detour's own LSDA, in the new segment's text) and
    `personality` when it moves a call the function's exception tables cover."""

    detour: Detour
    rows: tuple[tuple[int, Row], ...]
    lsda: int | None = None
    personality: Personality | None = None


# SiteDecision.verification (EMULATED, the emulator's check, is sites.calls's word too)
PROVED = "proved"
NOT_VERIFIED = "not verified"
VERIFICATIONS = (PROVED, EMULATED, NOT_VERIFIED)


@dataclass(frozen=True, slots=True)
class RewritePlan:
    """Every decision of one rewrite and the layout the builder follows.

    `text` is the code of the new segment from `text_addr` (the detours, int3 between them);
    `patches` are the in-place edits of the original bytes by file offset; `new_args` maps a
    probe's index to its guarded argument string.
    """

    image: ElfImage
    probeset: ProbeSet
    form: Form
    guard: Guard
    fork_guard: ForkGuard
    verified: bool
    sites: tuple[SiteDecision, ...]
    findings: tuple[Finding, ...]
    layout: SegmentLayout | None
    text_addr: int
    text: bytes
    unwind: tuple[DetourUnwind, ...]
    patches: tuple[tuple[int, bytes], ...]
    new_args: tuple[tuple[int, str], ...]
    # no site to rewrite, but its 5-byte sites need the fork guard (docs/fork-guard.md)
    guard_only: bool = False
    # why rewrite refuses the file: it may fork and cannot carry the fork guard (None: it
    # does not refuse); decided here so that --dry-run says what the real run does
    fork_refusal: str | None = None

    @property
    def changed(self) -> bool:
        """Whether building the plan changes the file."""
        return bool(self.patches) or self.guard_only

    @property
    def failed(self) -> bool:
        """Whether a site that should have been rewritten could not be."""
        return sites_failed(self.sites)

    @property
    def rewritten(self) -> int:
        return sum(1 for s in self.sites if s.status is Status.REWRITTEN)


def _skip(sc: SiteCheck, code: str, reason: str) -> SiteDecision:
    return SiteDecision(sc.probe, Action.SKIPPED, code, reason, None, None, None, False, 0)


def _needs_guard(sc: SiteCheck, guard: Guard) -> bool:
    if guard is Guard.ALWAYS:
        return True
    if guard is Guard.NEVER:
        return False
    return sc.red_zone is None or sc.red_zone.may_use


def check_rewritable(image: ElfImage) -> None:
    """Raise AlreadyRewritten or UnsupportedError when `image` cannot be rewritten at all."""
    if marker_of(image) is not None:
        raise AlreadyRewritten("already rewritten by usdtpatch (it carries a "
                               ".note.usdtpatch marker); `usdtpatch restore` gives the original")
    if image.machine != EM_X86_64 or not image.is64 or not image.little_endian:
        raise UnsupportedError(f"rewriting needs x86-64 ELF64 little-endian code, this is "
                               f"{image.machine_name} ELF{64 if image.is64 else 32}")
    if image.type not in (ET_EXEC, ET_DYN):
        raise UnsupportedError(f"{not_linked_message(image.type)}: "
                               f"{findings.NOT_LINKED.hint}")


def plan_rewrite(image: ElfImage, *, form: Form = Form.NOP5, guard: Guard = Guard.AUTO,
                 fork_guard: ForkGuard = ForkGuard.AUTO, verify: Verifier | None,
                 report: CheckReport | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 calls: str = CALLS_AUTO) -> RewritePlan:
    """Decide every site of `image` (pure: no I/O). `verify=None` skips the emulator's check.

    `progress(done, total)`, when given, is called after each site is decided. `calls` says
    how a window's calls are handled (CALL_CHOICES; docs/rewrite.md, "Windows that hold a
    call").
    """
    if calls not in CALL_CHOICES:
        raise ValueError(f"calls must be one of {', '.join(CALL_CHOICES)}, not {calls!r}")
    check_rewritable(image)
    ps: ProbeSet = report.probeset if report is not None else read_probes(image)

    def empty(sites: tuple[SiteDecision, ...], said: tuple[Finding, ...],
              layout: SegmentLayout | None) -> RewritePlan:
        return RewritePlan(image, ps, form, guard, fork_guard, verify is not None, sites,
                           said, layout, 0, b"", (), (), ())

    if ps.notes is None or not ps.probes:
        return empty((), ps.findings, None)
    rep = report if report is not None else check(ps)
    base_sec = image.section(BASE_SECTION)
    layout = plan_segment(image, base_sec.addr if base_sec is not None else None)

    cursor = layout.payload_vaddr
    text = bytearray()
    text_addr = cursor
    decided: dict[int, SiteDecision] = {}
    patches: list[tuple[int, bytes]] = []
    claimed = Claims()  # rewriter/index.py: overlap tests by bisection, not a scan
    unwind: list[DetourUnwind] = []
    new_args: dict[int, str] = {}
    found: list[Finding] = list(rep.findings)
    cfi = load_cfi(image)
    shstk = shadow_stack_marked(image)
    relocs = Relocations(image)  # read on the first question (few plans ask one)
    # every site at each address (two notes may name one pc)
    by_address = SitesByAddress(rep.sites)

    order = sorted(rep.sites, key=lambda s: s.probe.address)
    for n, sc in enumerate(order):
        if progress is not None:
            progress(n, len(rep.sites))
        p = sc.probe
        if p.index in decided:
            continue
        not_code = _not_code(sc)
        if not_code is not None:
            decided[p.index] = not_code
            continue
        if p.site.form in (SiteForm.NOP5, SiteForm.NOP5_ALT) and \
                sc.candidacy.kernel_618.code == findings.SITE_CROSSES_PAGE.code:
            # the kernel never optimizes a nop5 that crosses a page where it is: move it
            win = _page_crossing_window(p)
        elif _already_in_form(p.site.form, form):
            decided[p.index] = _skip(sc, findings.SITE_ALREADY_5_BYTE.code,
                                     f"already a {p.site.form.value} site")
            continue
        else:
            wr = sc.window
            if wr is None or wr.window is None:
                decided[p.index] = _skip(sc, sc.blocked or (wr.code if wr else None) or
                                         findings.NO_PATCH_WINDOW.code,
                                         wr.reason if wr is not None else "no patch window")
                continue
            win = join_following(wr.window, order, n)  # rewriter/merge.py
        if claimed.overlaps(win.start, win.end):
            decided[p.index] = _skip(sc, findings.WINDOW_OVERLAPS_SITE.code,
                                     "its window overlaps another rewritten site's")
            continue
        members = list(by_address.between(win.start, win.end))
        addresses = sorted({m.probe.address for m in members})
        guarded = any(_needs_guard(m, guard) for m in members)
        bad = None
        for m in members:
            if guarded:
                args, why = guard_args(m.probe.args)
                if why is not None:
                    bad = (findings.GUARD_IMPOSSIBLE.code, f"{m.probe.probe_id}: {why}")
                    break
                new_args[m.probe.index] = args
            numeric = uses_numeric_rip(m.probe.args)
            if numeric is not None and win.shape is not WindowShape.IN_PLACE:
                bad = (findings.ARG_RIP_RELATIVE.code,
                       f"{m.probe.probe_id}: argument {numeric!r} is read relative to rip and "
                       f"would move")
                break
        if bad is not None:
            decided[p.index] = _skip(sc, bad[0], bad[1])
            for m in members:
                new_args.pop(m.probe.index, None)
            continue
        sb = site_bytes(form, guarded)

        def optimized(at: int, sb: SiteBytes = sb) -> bool:
            """Whether the kernel optimizes the new site's NOP when it lies at `at`."""
            return optimized_where_it_is(sb.code[sb.optimized_offset :], at,
                                         nop10=form is Form.COMBO10)

        technique: str | None = None
        emulate: frozenset[int] = frozenset()
        eh: _DetourEh | None = None
        if win.calls:
            choice = _call_technique(image, cfi, win, calls, shstk)
            if isinstance(choice, str):
                decided[p.index] = _skip(sc, findings.WINDOW_CALL_UNWIND.code, choice)
                continue
            technique, emulate, eh = choice
        start_off = image.vaddr_to_offset(win.start)
        if start_off is None:
            decided[p.index] = _skip(sc, findings.PC_OUTSIDE_SEGMENTS.code,
                                     "window not in the file")
            continue

        in_place_ok = (win.shape is WindowShape.IN_PLACE and len(members) == 1
                       and len(sb.code) <= win.end - p.address and p.address == win.start
                       and optimized(p.address + sb.optimized_offset))
        if in_place_ok:
            code = sb.code + b"\x90" * (win.end - win.start - len(sb.code))
            patches.append((start_off, code))
            claimed.append((win.start, win.end))
            decided[p.index] = SiteDecision(p, Action.IN_PLACE, None,
                                            f"{form.value} written over {win.size} bytes of NOPs",
                                            p.address + sb.pc_offset, win, None, guarded, 0,
                                            verification=NOT_VERIFIED)
            continue

        # the probe instruction's real length (a hint-NOP or DS-prefixed nop5 site is 5 bytes;
        # `site.length` is None for the forms it does not classify as 1-byte nops)
        sizes = {i.address: i.size for i in win.insns}
        first_at = {a: next(m for m in members if m.probe.address == a) for a in addresses}
        reps = [Replacement(a, sizes.get(a, first_at[a].probe.site.length or 1), sb.code)
                for a in addresses]
        detour = None
        try:
            for _ in range(2):
                at = (cursor + 15) & ~15
                detour = relocate_window(win.code, win.start, reps, at, emulate)
                bad_page = [a for a, b in detour.insn_map
                            if a in {r.address for r in reps}
                            and not optimized(b + sb.optimized_offset)]
                if not bad_page:
                    break
                cursor = (at + 4096) & ~4095  # move the detour to the next page
                detour = None
            if detour is None:
                raise RelocationError("the new site would cross a page")
            jmp = jmp_rel32(win.start, detour.address)
            ways = _retarget_patches(image, win, detour, claimed, relocs)
        except _WayIn as exc:
            decided[p.index] = _skip(sc, findings.WINDOW_WAY_IN.code, str(exc))
            continue
        except RelocationError as exc:
            decided[p.index] = _skip(sc, findings.RELOCATION_FAILED.code, str(exc))
            continue
        if verify is not None:
            extra: dict[str, Any] = {}
            entries = _entries(win, detour)
            if ways or entries:
                extra = {"patches": tuple((a, b) for a, _o, b, _w in ways),
                         "entries": entries}
            why = verify(image, win, detour, tuple(r.address for r in reps), **extra)
            verification = getattr(verify, "last_method", EMULATED)
            if why is not None:
                decided[p.index] = SiteDecision(p, Action.SKIPPED,
                                                findings.VERIFICATION_FAILED.code, why, None,
                                                None, None, False, 0,
                                                verification=verification)
                continue
        else:
            verification = NOT_VERIFIED
        rows = _detour_rows(cfi, win, detour, guarded, emulate)
        lsda_at: int | None = None
        lsda_bytes = b""
        if eh is not None:
            lsda_at = (detour.end + 3) & ~3
            try:
                lsda_bytes = build_detour_lsda(image, eh.lsda, lsda_at, detour.address,
                                               _lsda_rows(eh.lsda, win, detour))
            except UnsupportedError as exc:
                decided[p.index] = _skip(sc, findings.WINDOW_CALL_UNWIND.code,
                                         f"the detour's LSDA cannot be built: {exc}")
                continue
            if isinstance(rows, str):
                decided[p.index] = _skip(sc, findings.WINDOW_CALL_UNWIND.code,
                                         f"the detour's FDE cannot be built: {rows}")
                continue
        if isinstance(rows, str) and technique == MOVED and cfi.lookup(win.start) is not None:
            # a moved call returns into the detour: without the detour's FDE, unwinding from
            # the callee would stop there (the original function has one)
            decided[p.index] = _skip(sc, findings.WINDOW_CALL_UNWIND.code,
                                     f"the detour's FDE cannot be built: {rows}")
            continue
        if isinstance(rows, str):
            found.append(findings.DETOUR_WITHOUT_CFI.finding(f"{p.probe_id}: {rows}",
                                                             p.probe_id))
        else:
            unwind.append(DetourUnwind(detour, tuple(rows), lsda_at,
                                       eh.personality if eh is not None else None))
        text += bytes([INT3]) * (detour.address - (text_addr + len(text))) + detour.code
        cursor = detour.end
        if lsda_at is not None:
            text += bytes([INT3]) * (lsda_at - (text_addr + len(text))) + lsda_bytes
            cursor = lsda_at + len(lsda_bytes)
        patches.append((start_off, jmp + bytes([INT3]) * (win.size - len(jmp))))
        claimed.append((win.start, win.end))
        for a, off, b, _w in ways:
            patches.append((off, b))
            claimed.append((a, a + len(b)))
        mapping = dict(detour.insn_map)
        for m in members:
            new_pc = mapping[m.probe.address] + sb.pc_offset
            action = Action.DETOUR if m.probe.index == p.index else Action.MOVED
            decided[m.probe.index] = SiteDecision(
                m.probe, action, None,
                f"{win.shape.value} window of {win.size} bytes relocated to {detour.address:#x}"
                + (f"; {len(win.calls)} call(s) {technique}" if win.calls else "")
                + (", with the detour's own LSDA" if eh is not None else "")
                + (f"; {len(ways)} way(s) in retargeted" if ways else ""),
                new_pc, win, detour, guarded, 2, technique,
                tuple(w for _a, _o, _b, w in ways), verification)

    ordered = tuple(decided[p.index] for p in ps.probes)
    place_at = (text_addr + len(text) + 15) & ~15  # where the builder puts the guard
    if not patches:
        if _guard_only(image, ordered, fork_guard):
            return RewritePlan(image, ps, form, guard, fork_guard, verify is not None, ordered,
                               tuple(found), layout, text_addr, b"", (), (), (), True,
                               fork_guard_refusal(image, form, ordered, fork_guard, place_at))
        return empty(ordered, tuple(found), layout)
    return RewritePlan(image, ps, form, guard, fork_guard, verify is not None, ordered,
                       tuple(found), layout, text_addr, bytes(text), tuple(unwind),
                       tuple(patches), tuple(sorted(new_args.items())), False,
                       fork_guard_refusal(image, form, ordered, fork_guard, place_at))


def output_nop5_sites(image: ElfImage, form: Form, sites: tuple[SiteDecision, ...]
                      ) -> tuple[tuple[int, bytes], ...]:
    """Every NOP the kernel will optimize in the output: (vaddr, its bytes in the output):
    the rewritten sites (at their new pc) and the sites that already were 5-byte NOPs."""
    off = form.optimized_offset
    out = [(s.new_pc + off, form.bytes[off : off + form.optimized_length])
           for s in sites if s.status is Status.REWRITTEN and s.new_pc is not None]
    out += existing_nop5_sites(image, sites)
    return tuple(sorted(out))


def fork_guard_refusal(image: ElfImage, form: Form, sites: tuple[SiteDecision, ...],
                       fork_guard: ForkGuard, place_at: int) -> str | None:
    """Why the rewrite of these decisions must be refused over the fork guard, or None: the
    file may fork (forkguard.fork_exposure; with --fork-guard always, any file) and the guard
    cannot be built for its optimized sites at `place_at`, where the builder puts it."""
    if fork_guard is ForkGuard.NEVER:
        return None
    from usdtpatch import forkguard

    exposure = forkguard.fork_exposure(image)
    if fork_guard is ForkGuard.AUTO and exposure is None:
        return None
    try:
        forkguard.build_guard(image, output_nop5_sites(image, form, sites), place_at)
    except forkguard.GuardUnsupported as exc:
        why = exposure or "--fork-guard always"
        return (f"the fork guard cannot be added ({exc}) and the optimized sites would crash "
                f"a forked child ({why}): rewrite with --fork-guard never to accept that")
    return None


def _guard_only(image: ElfImage, sites: tuple[SiteDecision, ...], fork_guard: ForkGuard
                ) -> bool:
    """Whether a file with nothing to rewrite still gets the fork guard: its sites already are
    5-byte NOPs the kernel optimizes, it carries no guard of its own (sys/sdt.h's), and it may
    fork (`auto`) or the guard is asked for (`always`). Then `rewrite` adds only the guard (or
    refuses the file when the guard cannot be added), rather than copy an unguarded file."""
    if fork_guard is ForkGuard.NEVER:
        return False
    from usdtpatch import forkguard

    if forkguard.coverage(image) is not None:
        return False
    if fork_guard is ForkGuard.AUTO and forkguard.fork_exposure(image) is None:
        return False
    return bool(forkguard.guarded_sites(existing_nop5_sites(image, sites)))


def existing_nop5_sites(image: ElfImage, sites: tuple[SiteDecision, ...]
                        ) -> list[tuple[int, bytes]]:
    """(vaddr, bytes) of the 5-byte NOP of every site left as it is because it already is a
    nop5, nop5-alt or combo5 site (combo5's NOP is one byte in), in the order of `sites`."""
    out: list[tuple[int, bytes]] = []
    for s in sites:
        form = s.probe.site.form
        if s.action is Action.SKIPPED and s.code == findings.SITE_ALREADY_5_BYTE.code and \
                form in (SiteForm.NOP5, SiteForm.NOP5_ALT, SiteForm.COMBO5):
            at = s.probe.address + nop5_offset(form)
            out.append((at, bytes(image.read_vaddr(at, 5))))
    return out


def _lsda_rows(lsda: Lsda, win: PatchWindow, detour: Detour) -> list[LsdaRow]:
    """The detour's call-site rows: each relocated instruction with its original row."""
    order = list(detour.insn_map)
    spans: list[tuple[int, int, int, int]] = []
    ends = {i.address: i.end for i in win.insns}
    for (orig, new), (_next_orig, next_new) in pairwise(order):
        if orig in ends:
            spans.append((orig, ends[orig], new, next_new))
    return detour_call_sites(lsda, spans)


class _WayIn(RelocationError):
    """A way into the window cannot be aimed at the detour here (not a failure: a skip)."""


def _entries(win: PatchWindow, detour: Detour) -> tuple[tuple[int, int], ...]:
    """(original, detour) address of each way into the window's interior the verifier runs
    from: every target reached from outside, and the return site of each moved call."""
    mapping = dict(detour.insn_map)
    out = {r.target for r in win.retargets}
    calls = set(win.calls)
    out |= {i.end for i in win.insns if i.address in calls and i.end < win.end}
    return tuple(sorted((a, mapping[a]) for a in out if a in mapping))


def _retarget_patches(image: ElfImage, win: PatchWindow, detour: Detour,
                      claimed: Sequence[tuple[int, int]], relocs: Relocations
                      ) -> list[tuple[int, int, bytes, str]]:
    """The edits that aim every way into the window from outside at the detour's copy:
    (vaddr, file offset, new bytes, description). RelocationError says why one cannot be."""
    mapping = dict(detour.insn_map)
    out: list[tuple[int, int, bytes, str]] = []
    stubs: dict[int, int] = {}
    if not isinstance(claimed, Claims):
        claimed = Claims(claimed)
    for r in win.retargets:
        copy = mapping.get(r.target)
        if copy is None:
            raise RelocationError(f"{r.target:#x} has no copy in the detour")
        for a, b, what in _one_retarget(image, r, copy, stubs, relocs):
            if claimed.overlaps(a, a + len(b)) or \
                    any(a < x + len(y) and x < a + len(b) for x, _o, y, _w in out):
                raise _WayIn(f"the way in at {r.source:#x} lies in another rewritten site's "
                             f"window")
            off = image.vaddr_to_offset(a)
            if off is None:
                raise RelocationError(f"the way in at {a:#x} is not in the file")
            out.append((a, off, b, what))
    return out


def _one_retarget(image: ElfImage, r: Retarget, copy: int, stubs: dict[int, int],
                  relocs: Relocations) -> list[tuple[int, bytes, str]]:
    src = r.source
    if r.how in (REL32, REL8_STUB):
        raw = bytes(image.read_vaddr(src, 8))
        n = 0
        while raw[n : n + 1] in (b"\x3e", b"\x2e", b"\xf2"):
            n += 1
        op = raw[n:]
        if r.how == REL32:
            if op[:1] in (b"\xe8", b"\xe9"):
                head = n + 1
            elif op[:1] == b"\x0f" and 0x80 <= op[1] <= 0x8F:
                head = n + 2
            else:
                raise _WayIn(f"the branch at {src:#x} into the window is not a rel32 "
                             f"jmp/jcc/call")
            rel = copy - (src + head + 4)
            if not -(1 << 31) <= rel < 1 << 31:
                raise RelocationError(f"the branch at {src:#x} cannot reach {copy:#x}")
            return [(src + head, rel.to_bytes(4, "little", signed=True),
                     f"{r.kind} from {src:#x} (rel32)")]
        if not (op[:1] == b"\xeb" or 0x70 <= op[0] <= 0x7F) or r.stub is None:
            raise _WayIn(f"the branch at {src:#x} into the window is not a rel8 jmp/jcc")
        out: list[tuple[int, bytes, str]] = []
        if r.target not in stubs:
            stubs[r.target] = r.stub  # unused padding after the function (the analysis's)
            out.append((r.stub, jmp_rel32(r.stub, copy), f"stub at {r.stub:#x}"))
        stub = stubs[r.target]
        rel = stub - (src + n + 2)
        if not -128 <= rel <= 127:
            raise RelocationError(f"the rel8 branch at {src:#x} cannot reach its stub")
        out.append((src + n + 1, rel.to_bytes(1, "little", signed=True),
                    f"{r.kind} from {src:#x} (rel8, via the stub at {stub:#x})"))
        return out
    if r.how == TABLE4:
        old = int.from_bytes(bytes(image.read_vaddr(src, 4)), "little", signed=True)
        if (r.base + old) & 0xFFFFFFFFFFFFFFFF != r.target:
            raise RelocationError(f"the jump-table entry at {src:#x} does not hold "
                                  f"{r.target:#x}")
        rel = copy - r.base
        if not -(1 << 31) <= rel < 1 << 31:
            raise RelocationError(f"the jump-table entry at {src:#x} cannot reach {copy:#x}")
        return [(src, rel.to_bytes(4, "little", signed=True),
                 f"jump-table entry at {src:#x}")]
    if r.how == TABLE8:
        old = int.from_bytes(bytes(image.read_vaddr(src, 8)), "little")
        pic = relocs.relative(src)
        if pic is not None:
            # a position-independent table: the loader stores base + addend there; the
            # addend is rewritten, and the file's own bytes too (what the emulator reads)
            addend, at = pic
            if addend != r.target:
                raise _WayIn(f"the jump-table entry at {src:#x} does not hold {r.target:#x}")
            if at is None:
                raise _WayIn(f"the relocation of the jump-table entry at {src:#x} is not in "
                             f"a loaded SHT_RELA table")
            return [(src, copy.to_bytes(8, "little"), f"jump-table entry at {src:#x}"),
                    (at, copy.to_bytes(8, "little", signed=True),
                     f"its R_X86_64_RELATIVE addend at {at:#x}")]
        if old != r.target:
            raise _WayIn(f"the jump-table entry at {src:#x} does not hold {r.target:#x}")
        return [(src, copy.to_bytes(8, "little"), f"jump-table entry at {src:#x}")]
    raise RelocationError(f"unknown way in {r.how!r}")


class Relocations:
    """The SHT_RELA tables of one file, for one plan: each table is read once, on the first
    question (usdtpatch.elf.relocs.RelaTable; a plan that asks nothing reads nothing), and
    every place is then looked up in the tables' index rather than by decoding them again.
    One per `plan_rewrite` call: nothing is kept between calls."""

    __slots__ = ("_image", "_tables")

    def __init__(self, image: ElfImage) -> None:
        self._image = image
        self._tables: list[tuple[Section, RelaTable]] | None = None

    def tables(self) -> list[tuple[Section, RelaTable]]:
        """Every SHT_RELA section with its table, in section order."""
        if self._tables is None:
            self._tables = [(sec, RelaTable(self._image, sec.offset, sec.size))
                            for sec in self._image.sections if sec.type == SHT_RELA]
        return self._tables

    def relative(self, place: int) -> tuple[int, int | None] | None:
        """The R_X86_64_RELATIVE relocation of the 8-byte word at `place`, or None when no
        table has one: (the addend the loader stores there, the link-time address of that
        addend's field in an allocated SHT_RELA table, the one the loader applies, or None).

        The addend is the last such entry of the tables that lie inside the file (applied in
        order, the last one stays); the field is the first in an allocated table."""
        addend: int | None = None
        size = len(self._image.data)
        for sec, table in self.tables():
            if sec.offset + sec.size > size:
                continue
            for _r_offset, rtype, value in table.in_range(place, place + 8):
                if rtype == R_X86_64_RELATIVE:
                    addend = value
        if addend is None:
            return None
        for sec, table in self.tables():
            if not sec.allocated or not sec.addr:
                continue
            for entry, rtype, _value in table.at(place):
                if rtype == R_X86_64_RELATIVE:
                    return addend, sec.addr + (entry - sec.offset) + 16  # r_addend's field
        return addend, None


def _already_in_form(site: SiteForm, form: Form) -> bool:
    """Whether a site of form `site` is left as it is for the target `form`: a 5-byte NOP
    site (nop5, nop5-alt, combo5) always; a 10-byte one (nop10, combo10: only the queued
    nop10 series optimizes it) only for a nop10-series target (--form combo10). For a 6.18
    target it is rewritten like any NOP run: a nop5 in place, or guarded in a detour."""
    if site in (SiteForm.NOP5, SiteForm.NOP5_ALT, SiteForm.COMBO5):
        return True
    return site in (SiteForm.COMBO10, SiteForm.NOP10) and form is Form.COMBO10


def _not_code(sc: SiteCheck) -> SiteDecision | None:
    """The skip of a site whose pc check found not to be code (data in code, or not an
    instruction boundary), whatever its form: no byte there is written."""
    wr = sc.window
    if wr is not None and wr.code in (findings.PROBE_NOT_CODE.code,
                                      findings.PROBE_NOT_DECODED.code):
        return _skip(sc, wr.code, wr.reason)
    return None


def _page_crossing_window(p: Probe) -> PatchWindow:
    """The window of a nop5 site that crosses a page: the nop5 alone, moved to a detour where
    it does not cross one (a jmp rel32 fills its 5 bytes exactly)."""
    code = p.code[:5]
    return PatchWindow(WindowShape.FORWARD, p.address, p.address + 5, p.address, 5,
                       sweep(code, p.address).insns, code, None, 5, 2,
                       "the probe's nop5, which crosses a 4 KiB page",
                       "the end of the nop5", (), (), p.address, p.address + 5)


def _detour_rows(cfi: CfiIndex, win: PatchWindow, detour: Detour,
                 guarded: bool, emulated: frozenset[int] = frozenset()
                 ) -> list[tuple[int, Row]] | str:
    fde = cfi.lookup(win.start)
    if fde is None:
        return f"no FDE covers the window at {win.start:#x}"
    try:
        rows = rows_at(fde, [a for a, _ in detour.insn_map])
    except UnsupportedError as exc:
        return f"the FDE at {fde.address:#x} cannot be replayed: {exc}"
    out: list[tuple[int, Row]] = []
    site_len = detour.site_length
    for orig, new in detour.insn_map:
        row = rows[orig]
        out.append((new, row))
        if orig in emulated:  # `push %rax` moved rsp down by 8 until the jmp
            if row.cfa.reg == RSP:
                out.append((new + 1, row.with_cfa_offset(8)))
            elif row.cfa.reg is None:
                return "the CFA is an expression at the emulated call"
        if guarded and orig != win.end and new + site_len <= detour.end and \
                detour.code[new - detour.address : new - detour.address + len(GUARD_ENTER)] == \
                GUARD_ENTER:
            if row.cfa.reg == RSP:
                out.append((new + len(GUARD_ENTER), row.with_cfa_offset(RED_ZONE)))
                out.append((new + site_len - 8, row.with_cfa_offset(RED_ZONE)))
                out.append((new + site_len, row))
            elif row.cfa.reg is None:
                return "the CFA is an expression at the probe; the guard cannot be described"
    return out
