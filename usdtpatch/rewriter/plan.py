"""Rewrite, step 1: decide every site. The result is a `RewritePlan`, frozen data.

The flow is one way: the probes and their check (patch windows, red-zone verdicts, from
usdtpatch.analysis.check) -> one `SiteDecision` per probe -> the detours laid out in the new
segment -> what the whole file gets (the fork guard, the detours' symbols, the findings of
the output). Nothing here makes the output file: `usdtpatch.rewriter.build.build_rewrite(plan)`
does, deciding nothing, and `rewrite --dry-run` prints a plan without building it, so the dry
run says what the real run does.

Each site is decided by `_decide_site`, in steps that read in order and each decide or leave
the site as it is (raise `_Skip` with the finding code and why): its window (`_window`), the
windows already taken, the window used (analysis/check.used_window), its sites' arguments
(`_member_args`), the window's calls (`_call_handling`), then in place or a detour
(`_detoured`: `_relocated`, the ways in, `_verified`, `_detour_unwind`). What an accepted
site adds (code, edits, unwind rows, arguments) goes into one `_Segment`; `_whole_file` makes
the plan of it.

Every detour is handed to the verifier (the emulator's equivalence check) before it is
accepted; a site whose detour fails is left as it was and reported. The verifier is a required
argument: a caller that skips verification says so with `verify=None`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from itertools import pairwise
from typing import Any

from usdtpatch import findings, forkguard
from usdtpatch.analysis.calls import (
    CALL_CHOICES,
    CALLS_AUTO,
    EMULATED,
    MOVED,
    return_addresses,
    shadow_stack_marked,
)
from usdtpatch.analysis.calls import DetourEh as _DetourEh
from usdtpatch.analysis.calls import Refusal as _Refusal
from usdtpatch.analysis.calls import detour_handling as _detour_handling
from usdtpatch.analysis.check import (
    CheckReport,
    SiteCheck,
    check,
    needs_red_zone_guard,
    relaid_window,
    used_window,
)
from usdtpatch.analysis.closed import REFUSALS
from usdtpatch.analysis.debuglines import window_debug_refusal
from usdtpatch.analysis.forms import (
    ForkGuard,
    Form,
    Guard,
    SiteBytes,
    guard_args,
    left_as_is,
    site_bytes,
    uses_numeric_rip,
)
from usdtpatch.analysis.hazards import detour_unwind_left_out
from usdtpatch.analysis.index import Claims, SitesByAddress
from usdtpatch.analysis.merge import join_following
from usdtpatch.analysis.observed import may_fault
from usdtpatch.analysis.probes import (
    BASE_SECTION,
    Probe,
    ProbeSet,
    not_linked_message,
    read_probes,
)
from usdtpatch.analysis.rules import optimized_where_it_is
from usdtpatch.analysis.targets import CodeContext
from usdtpatch.analysis.windows import (
    MAX_WINDOW,
    REL8_STUB,
    REL32,
    TABLE4,
    TABLE8,
    PatchWindow,
    Retarget,
    WindowShape,
)
from usdtpatch.elf.cfi import CfiIndex, Lsda, debug_frame_fde, eh_frame_unindexed, load_cfi
from usdtpatch.elf.dwarf import DwarfToExtend, read_for_detours
from usdtpatch.elf.dynsym import dynsym_left_out, exported_functions
from usdtpatch.elf.ehframe import (
    RSP,
    LsdaRow,
    Personality,
    Row,
    build_detour_lsda,
    detour_call_sites,
    fde_program,
    rows_at,
)
from usdtpatch.elf.image import (
    EM_X86_64,
    ET_DYN,
    ET_EXEC,
    SHF_ALLOC,
    SHF_COMPRESSED,
    SHT_PROGBITS,
    SHT_RELA,
    SHT_SYMTAB,
    ElfImage,
    Section,
)
from usdtpatch.elf.marker import marker_of
from usdtpatch.elf.model import R_X86_64_RELATIVE
from usdtpatch.elf.relocs import RelaTable
from usdtpatch.elf.symbols import DETOUR_PREFIX, SymtabInPlace, symtab_in_place
from usdtpatch.elf.writer import SegmentLayout, added_sections_index, plan_segment
from usdtpatch.errors import UnsupportedError
from usdtpatch.findings import Finding
from usdtpatch.kernelfacts import DEFAULT, RED_ZONE
from usdtpatch.rewriter.marker import AlreadyRewritten
from usdtpatch.x86.decode import sweep
from usdtpatch.x86.nops import FORMS, GUARD_ENTER
from usdtpatch.x86.relocate import (
    Detour,
    RelocationError,
    Replacement,
    jmp_rel8,
    jmp_rel32,
    relocate_window,
)

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


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowSpan:
    """What the output's build, its restore marker and the report read of a decided window:
    its bounds, its shape and its function's bounds (PatchWindow's fields of those names)."""

    shape: WindowShape
    start: int
    end: int
    function_start: int
    function_end: int

    @classmethod
    def of(cls, win: PatchWindow) -> WindowSpan:
        return cls(shape=win.shape, start=win.start, end=win.end,
                   function_start=win.function_start, function_end=win.function_end)


@dataclass(frozen=True, slots=True, kw_only=True)
class SiteDecision:
    """The decision on one probe's site. `span` is set wherever `window` was: the window
    itself (its instructions and bytes) is dropped once the site is decided where the plan
    is made for the output only (plan_rewrite's `windows=False`: rewrite's memory, issue 38),
    its span is kept."""

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
    # a re-laid window's bytes at its own address (analysis/relay.py: verified as a detour
    # is); None for every other site
    relaid: Detour | None = None
    # what an observer now sees (docs/rewrite.md, "What a moved instruction's pc and a moved
    # call's return address look like"): (call, original return address, the return address
    # its callee sees) of each call of the window, and (original pc, pc now) of each moved
    # instruction that can fault (a signal handler reads the second)
    returns: tuple[tuple[int, int, int], ...] = ()
    faults: tuple[tuple[int, int], ...] = ()
    span: WindowSpan | None = None

    @property
    def status(self) -> Status:
        if self.action is not Action.SKIPPED:
            return Status.REWRITTEN
        return Status.FAILED if self.code in FAILURE_CODES else Status.UNCHANGED


@dataclass(frozen=True, slots=True, kw_only=True)
class DetourUnwind:
    """A detour's unwind information: its [start, end) in the new segment and the call frame
    instructions of its rows (usdtpatch.elf.ehframe.fde_program, from the FDE of its window:
    the same bytes go to `.eh_frame` and `.debug_frame`; made when the detour is, so that the
    plan holds a few bytes a detour, not its rows); with `lsda` (the address of the detour's
    own LSDA, in the new segment's text) and `personality` when it moves a call the
    function's exception tables cover."""

    start: int
    end: int
    program: bytes
    lsda: int | None = None
    personality: Personality | None = None


# SiteDecision.verification (EMULATED, the emulator's check, is sites.calls's word too)
PROVED = "proved"
NOT_VERIFIED = "not verified"
VERIFICATIONS = (PROVED, EMULATED, NOT_VERIFIED)


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkGuardCode:
    """What the fork guard adds: code at `address` in the new segment, and in-place edits
    (file offset, bytes) that make the object register the guard when it loads."""

    address: int
    text: bytes
    patches: tuple[tuple[int, bytes], ...]
    symbols: tuple[tuple[str, int, int], ...] = ()  # (name, address, size)
    marker: tuple[tuple[str, object], ...] = ()  # what the restore marker records of it
    # it hooks the system calls whose number the code does not fix (the input's
    # `fork-unknown`), comparing the number with the fork ones at run time
    checks_numbers: bool = False
    # the [start, end) of each system call's window moved to its hook (a static executable)
    hooked: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class UnwindTables:
    """Where the detours' unwind rows go (docs/rewrite.md, "What each consumer needs"): a new
    `.eh_frame_hdr` indexing the original `.eh_frame` (at `eh_frame`) and the detours' FDEs,
    and the same FDEs in `.debug_frame` for gdb when `debug_frame` (the input has none, or a
    plain one: not loaded, not compressed)."""

    eh_frame: int
    debug_frame: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RewritePlan:
    """Every decision of one rewrite and the layout the builder follows (built by keyword,
    as every record here is).

    `text` is the code of the new segment from `text_addr` (the detours, int3 between them);
    `patches` are the in-place edits of the original bytes by file offset; `new_args` maps a
    probe's index to its guarded argument string. `findings` are those of the output: the
    builder adds none.
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
    text_addr: int = 0
    text: bytes = b""
    unwind: tuple[DetourUnwind, ...] = ()
    patches: tuple[tuple[int, bytes], ...] = ()
    new_args: tuple[tuple[int, str], ...] = ()
    # no site to rewrite, but its 5-byte sites need the fork guard (docs/fork-guard.md)
    guard_only: bool = False
    # why rewrite refuses the file: it may fork and cannot carry the fork guard (None: it
    # does not refuse); decided here so that --dry-run says what the real run does
    fork_refusal: str | None = None
    fork_guard_code: ForkGuardCode | None = None  # the fork guard the output carries
    symbols: DetourSymbols | None = None  # None: the plan does not change the file
    # None: no unwind tables are added (no detour rows, or the input has no `.eh_frame` with
    # a PT_GNU_EH_FRAME header the runtime unwinders find it by)
    unwind_tables: UnwindTables | None = None
    # the input's DWARF the detours' compile unit extends (None: no detour, no DWARF, or it
    # cannot be extended: `detour-dwarf-left-out` says why)
    dwarf: DwarfToExtend | None = None

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


def _skip(sc: SiteCheck, code: str, reason: str, verification: str | None = None
          ) -> SiteDecision:
    return SiteDecision(probe=sc.probe, action=Action.SKIPPED, code=code, reason=reason,
                        new_pc=None, window=None, detour=None, guarded=False, extra_jumps=0,
                        verification=verification)


class _Skip(Exception):
    """A step of a site's decision leaves the site as it is: the finding code and why."""

    def __init__(self, code: str, reason: str, verification: str | None = None) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.verification = verification


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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Inputs:
    """What every site's decision reads, fixed for one plan."""

    image: ElfImage
    form: Form
    guard: Guard
    calls: str
    verify: Verifier | None
    cfi: CfiIndex
    shstk: bool
    relocs: Relocations
    by_address: SitesByAddress[SiteCheck]  # the sites given so far (two notes may name one pc)
    ctx: CodeContext | None = None  # check's analysis (re-laying asks it, as check does)


@dataclass(slots=True, kw_only=True)
class _Segment:
    """What the accepted sites have added so far, in the order they were accepted: the new
    segment's code from `text_addr` (the next detour goes at `cursor` or after), the edits of
    the original bytes by file offset and the address ranges they claim, the detours' unwind
    rows, the guarded argument strings and the plan's findings."""

    text_addr: int
    cursor: int
    text: bytearray
    patches: list[tuple[int, bytes]]
    claimed: Claims  # analysis/index.py: overlap tests by bisection, not a scan
    unwind: list[DetourUnwind]
    new_args: dict[int, str]
    found: list[Finding]

    def add_code(self, at: int, code: bytes) -> None:
        """Put `code` at `at` in the new segment (int3 over the gap before it)."""
        self.text += bytes([INT3]) * (at - (self.text_addr + len(self.text))) + code
        self.cursor = at + len(code)

    def patch(self, vaddr: int, offset: int, code: bytes) -> None:
        """Edit the original bytes at file `offset` (link-time `vaddr`) and claim them."""
        self.patches.append((offset, code))
        self.claimed.append((vaddr, vaddr + len(code)))


def plan_rewrite(image: ElfImage, *, form: Form = Form.NOP5, guard: Guard = Guard.AUTO,
                 fork_guard: ForkGuard = ForkGuard.AUTO, verify: Verifier | None,
                 report: CheckReport | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 calls: str = CALLS_AUTO, windows: bool = True) -> RewritePlan:
    """Decide every site of `image` (pure: no I/O). `verify=None` skips the emulator's check.

    `progress(done, total)`, when given, is called as each site's decision starts (`done`
    sites decided before it). `calls` says how a window's calls are handled (CALL_CHOICES;
    docs/rewrite.md, "Windows that hold a call"). Without `report`, the sites are decided
    during the check's walk, each once the check has settled every site its decision reads
    (`_Walk`). With `windows=False` (a plan made to build the output), each decision keeps
    its window's span only, and each site's window is let go once the walk has passed it,
    so that no more than a stretch of the file's windows is held at once (issue 38:
    rewrite's memory); the decisions are the same.
    """
    if calls not in CALL_CHOICES:
        raise ValueError(f"calls must be one of {', '.join(CALL_CHOICES)}, not {calls!r}")
    check_rewritable(image)
    ps: ProbeSet = report.probeset if report is not None else read_probes(image)
    if ps.notes is None or not ps.probes:
        return RewritePlan(image=image, probeset=ps, form=form, guard=guard,
                           fork_guard=fork_guard, verified=verify is not None, sites=(),
                           findings=ps.findings, layout=None)
    base_sec = image.section(BASE_SECTION)
    layout = plan_segment(image, base_sec.addr if base_sec is not None else None, ps.symbols)
    seg = _Segment(text_addr=layout.payload_vaddr, cursor=layout.payload_vaddr,
                   text=bytearray(), patches=[], claimed=Claims(), unwind=[], new_args={},
                   found=[])
    walk = _Walk(image, form=form, guard=guard, calls=calls, verify=verify, seg=seg,
                 total=len(ps.probes), progress=progress, windows=windows,
                 let_go=not windows and report is None)
    if report is not None:  # its windows are the caller's: another plan may read them
        walk.start(report.context)
        for sc in sorted(report.sites, key=lambda s: s.probe.address):
            walk.feed(sc, sc)
        rep = report
    else:
        rep = check(ps, keep=walk.keep, context=walk.start)
    walk.finish()
    # the check's findings first (said again in _whole_file only where a detour is added); a
    # site a generation cannot probe is said of the input only where the output keeps it
    moved = {d.probe.probe_id for d in walk.decided.values() if d.new_pc is not None}
    seg.found[:0] = [f for f in rep.findings if f.code != findings.DETOUR_UNWIND_LEFT_OUT.code
                     and not (f.code == findings.SITE_PROBE_LOST.code and f.where in moved)]
    del rep
    return _whole_file(RewritePlan(image=image, probeset=ps, form=form, guard=guard,
                                   fork_guard=fork_guard, verified=verify is not None,
                                   sites=tuple(walk.decided[p.index] for p in ps.probes),
                                   findings=tuple(seg.found), layout=layout), seg)


# How far past a site (bytes, address order) the sites its decision reads may lie: a window
# and the windows it joins end within MAX_WINDOW bytes of its start (analysis/merge.py), and
# no window starts after its probe. SitesByAddress.between checks it of every question asked.
REACH = 2 * MAX_WINDOW


class _Walk:
    """The plan's walk over the sites in address order (`_decide_site` for each): the sites
    are fed as the check settles them (`keep`, check's) and each is decided once every site
    within REACH bytes after it is here; `finish` decides the rest. With `let_go`, a site's
    window is let go once the walk has passed it (a site's decision reads the windows of
    the site and of those after it, of the sites before it their probes and red zones only)."""

    def __init__(self, image: ElfImage, *, form: Form, guard: Guard, calls: str,
                 verify: Verifier | None, seg: _Segment, total: int,
                 progress: Callable[[int, int], None] | None, windows: bool,
                 let_go: bool) -> None:
        self.image, self.form, self.guard, self.calls, self.verify = \
            image, form, guard, calls, verify
        self.seg, self.total, self.progress = seg, total, progress
        self.windows, self.let_go = windows, let_go
        self.inputs: _Inputs | None = None
        self.sites: SitesByAddress[SiteCheck] = SitesByAddress()
        self.order = self.sites.sites  # every site fed, in address order
        self.slim: list[SiteCheck | None] = []  # what replaces it once passed (let_go)
        self.next = 0  # the first site not decided yet
        self.decided: dict[int, SiteDecision] = {}

    def start(self, ctx: CodeContext | None) -> None:
        """Before the first site: the check's analysis context (re-laying asks it)."""
        self.inputs = _Inputs(image=self.image, form=self.form, guard=self.guard,
                              calls=self.calls, verify=self.verify, cfi=load_cfi(self.image),
                              shstk=shadow_stack_marked(self.image),
                              relocs=Relocations(self.image),  # read on the first question
                              by_address=self.sites, ctx=ctx)

    def keep(self, sc: SiteCheck) -> SiteCheck:
        """check's `keep`: the site goes to the walk; the check keeps it without its window
        when the plan lets windows go (the walk holds the window until it has passed)."""
        slim = replace(sc, window=None) if self.let_go and sc.window is not None else sc
        self.feed(sc, slim)
        return slim

    def feed(self, sc: SiteCheck, slim: SiteCheck) -> None:
        """The next site in address order, and what replaces it once the walk has passed it;
        then every site that can be decided now."""
        self.sites.add(sc)
        self.slim.append(slim if slim is not sc else None)
        while self.next < len(self.order) and \
                self.sites.has(self.order[self.next].probe.address + REACH + 1):
            self._decide_next()

    def finish(self) -> None:
        """Every site is fed: decide the rest."""
        self.sites.ended = True
        while self.next < len(self.order):
            self._decide_next()

    def _decide_next(self) -> None:
        n = self.next
        assert self.inputs is not None, "start() before the first site"
        if self.let_go and n:
            self._passed(n - 1)
        if self.progress is not None:
            self.progress(n, self.total)
        self.next += 1
        sc = self.order[n]
        if sc.probe.index in self.decided:
            return  # moved along in an earlier site's window
        try:
            for d in _decide_site(self.inputs, self.seg, self.order, n):
                self.decided[d.probe.index] = d if self.windows else replace(d, window=None)
        except _Skip as skip:
            self.decided[sc.probe.index] = _skip(sc, skip.code, skip.reason, skip.verification)

    def _passed(self, k: int) -> None:
        """Let go of the window of `order[k]`, a site the walk has passed, and of what the
        check's context keeps for it (its function's bounds: ~0.3 KB a site)."""
        slim = self.slim[k]
        self.slim[k] = None
        if slim is not None:
            self.order[k] = slim
        if self.inputs is not None and self.inputs.ctx is not None:
            self.inputs.ctx.forget_site(self.order[k].probe.address)


def _decide_site(inputs: _Inputs, seg: _Segment, order: list[SiteCheck], n: int
                 ) -> list[SiteDecision]:
    """The decisions on the site `order[n]` and the sites its window takes along, added to
    `seg`; raises _Skip when the site stays as it is. In order: its window, the sites in it
    and their arguments, the window's calls, then in place or a detour."""
    sc = order[n]
    win = _window(sc, order, n, inputs.form)
    relaid = _relaid(inputs, seg, sc, win, order)
    if relaid is not None:
        return relaid
    if not inputs.by_address.has(win.start + MAX_WINDOW):
        raise AssertionError(f"the window at {win.start:#x} may join sites not given yet")
    win = join_following(win, order, n)
    if seg.claimed.overlaps(win.start, win.end):
        raise _Skip(findings.WINDOW_OVERLAPS_SITE.code,
                    "its window overlaps another rewritten site's")
    members = inputs.by_address.between(win.start, win.end)
    guarded = any(needs_red_zone_guard(m, inputs.guard, inputs.form) for m in members)
    win = used_window(win, sc.probe, [m.probe for m in members], inputs.form, guarded)
    new_args = _member_args(members, win, guarded)
    sb = site_bytes(inputs.form, guarded)
    start_off = inputs.image.vaddr_to_offset(win.start)
    if start_off is None:
        raise _Skip(findings.PC_OUTSIDE_SEGMENTS.code, "window not in the file")
    if win.shape is WindowShape.IN_PLACE:  # analysis/check.used_window: it stays in place
        _debug_kept_true(inputs, win)
        seg.patch(win.start, start_off, sb.code + b"\x90" * (win.size - len(sb.code)))
        seg.new_args.update(new_args)
        return [SiteDecision(probe=sc.probe, action=Action.IN_PLACE, code=None,
                             reason=f"{inputs.form.value} written over {win.size} bytes of NOPs",
                             new_pc=sc.probe.address + sb.pc_offset, window=win,
                             span=WindowSpan.of(win), detour=None,
                             guarded=guarded, extra_jumps=0, verification=NOT_VERIFIED)]
    handling = _call_handling(inputs, win)
    _debug_kept_true(inputs, win)
    return _detoured(inputs, seg, sc, win, members, sb, handling, start_off, new_args)


def _debug_kept_true(inputs: _Inputs, win: PatchWindow) -> None:
    """_Skip where a debugger's breakpoint address inside the window cannot be kept true
    (analysis/debuglines.py), asked after the window's calls as check asks it."""
    debug = window_debug_refusal(inputs.image, win.start, win.end)
    if debug is not None:
        raise _Skip(*debug)


def _window(sc: SiteCheck, order: list[SiteCheck], n: int, form: Form) -> PatchWindow:
    """The window the site `order[n]` is rewritten in, or _Skip: not code, already in the
    form, no window. A nop5 the kernel never optimizes where it is (it crosses a page) is
    moved as it is; a window is joined with the sites that follow it (analysis/merge.py)."""
    p = sc.probe
    wr = sc.window
    if wr is not None and wr.window is None and wr.code in REFUSALS:
        raise _Skip(wr.code, wr.reason)  # outside the model (analysis/closed.py), as check says
    if wr is not None and wr.code in (findings.PROBE_NOT_CODE.code,
                                      findings.PROBE_NOT_DECODED.code):
        raise _Skip(wr.code, wr.reason)  # data in code, or not an instruction boundary
    facts = FORMS[p.site.form]
    if facts.nop_at == 0 and facts.nop_length == DEFAULT.nop_length and \
            sc.candidacy.verdict(DEFAULT).code == findings.SITE_CROSSES_PAGE.code:
        return _page_crossing_window(p)
    if left_as_is(p.site.form, form):
        raise _Skip(findings.SITE_ALREADY_5_BYTE.code, f"already a {p.site.form.value} site")
    if wr is None or wr.base is None:
        raise _Skip(sc.blocked or (wr.code if wr else None) or findings.NO_PATCH_WINDOW.code,
                    wr.reason if wr is not None else "no patch window")
    return wr.base


def _relaid(inputs: _Inputs, seg: _Segment, sc: SiteCheck, win: PatchWindow,
            order: list[SiteCheck]) -> list[SiteDecision] | None:
    """The site re-laid where it is (analysis/relay.py, asked as check asks it), verified as
    a detour is; None when it cannot be, or its re-laid bytes fail verification (the site
    then gets a detour, if that verifies: the failure is not reported, nothing is written)."""
    if inputs.ctx is None:
        return None
    got = relaid_window(inputs.ctx, sc, win, seg.claimed, inputs.form, inputs.guard,
                        inputs.by_address.between)
    if got is None:
        return None
    w, laid = got.window, got.code
    off = inputs.image.vaddr_to_offset(w.start)
    if off is None:
        return None
    try:
        verification = _verified(inputs, w, laid, [Replacement(w.start, w.probe_length,
                                                               laid.code[:laid.site_length])],
                                 [])
    except _Skip:
        return None
    seg.patch(w.start, off, laid.code)
    faults = moved_faults(w, laid)
    # a call of a re-laid window ends where it ended: its callee sees the original
    returns = tuple((c, r, r) for c, r, _seen in return_addresses(w, None))
    return [SiteDecision(probe=sc.probe, action=Action.IN_PLACE, code=None,
                         reason=f"re-laid in place: {w.size} bytes re-encoded, "
                                f"{inputs.form.value} at the probe's address"
                                + observed_text(returns, faults),
                         new_pc=sc.probe.address, window=w, span=WindowSpan.of(w),
                         detour=None, guarded=False,
                         extra_jumps=0, calls=None, verification=verification,
                         relaid=laid, returns=returns, faults=faults)]


def _member_args(members: list[SiteCheck], win: PatchWindow, guarded: bool) -> dict[int, str]:
    """The guarded argument strings of the sites in the window (probe index -> arguments;
    none unguarded), or _Skip: an argument the guard cannot adjust, or one read relative to
    rip in a window that moves."""
    out: dict[int, str] = {}
    for m in members:
        if guarded:
            args, why = guard_args(m.probe.args)
            if why is not None:
                raise _Skip(findings.GUARD_IMPOSSIBLE.code, f"{m.probe.probe_id}: {why}")
            out[m.probe.index] = args
        numeric = uses_numeric_rip(m.probe.args)
        if numeric is not None and win.shape not in (WindowShape.IN_PLACE, WindowShape.RELAID):
            raise _Skip(findings.ARG_RIP_RELATIVE.code,
                        f"{m.probe.probe_id}: argument {numeric!r} is read relative to rip and "
                        f"would move")
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class _Calls:
    """How the window's calls go along (analysis/calls.py): the technique (MOVED, EMULATED,
    None without a call), the calls emulated, and the exception tables a moved call needs."""

    technique: str | None = None
    emulate: frozenset[int] = frozenset()
    eh: _DetourEh | None = None


def _call_handling(inputs: _Inputs, win: PatchWindow) -> _Calls:
    """How the calls of a window that moves to a detour are handled, and whether the detour
    needs its own LSDA (analysis/calls.py, as check asks it), or _Skip when they cannot go
    along (`window-call-unwind`) or the LSDA cannot be built (`window-eh-unwind`)."""
    choice = _detour_handling(inputs.image, inputs.cfi, win, inputs.calls, inputs.shstk)
    if isinstance(choice, _Refusal):
        raise _Skip(choice.code, choice.reason)
    return _Calls(technique=choice.technique, emulate=choice.emulate, eh=choice.eh)


def _optimized(form: Form, sb: SiteBytes, at: int) -> bool:
    """Whether the kernel optimizes the new site's NOP when the site lies at `at`."""
    return optimized_where_it_is(sb.code[sb.optimized_offset :], at + sb.optimized_offset,
                                 form.kernel)


def _detoured(inputs: _Inputs, seg: _Segment, sc: SiteCheck, win: PatchWindow,
              members: list[SiteCheck], sb: SiteBytes, handling: _Calls, start_off: int,
              new_args: dict[int, str]) -> list[SiteDecision]:
    """The decisions of a window moved to a detour (the site's DETOUR, the others' MOVED),
    added to `seg`; or _Skip: it cannot be relocated, a way in cannot be aimed at it, it
    fails verification, or its unwind information cannot be built."""
    reps = _replacements(win, members, sb)
    detour = _relocated(inputs, seg, win, reps, sb, handling.emulate)
    try:
        jmp = jmp_rel32(win.start, detour.address)
        ways = _retarget_patches(inputs.image, win, detour, seg.claimed, inputs.relocs)
        if win.entry_stub is not None:  # a short window: jmp rel8 to a jmp rel32 stub
            jmp = jmp_rel8(win.start, win.entry_stub)
            ways.append(_entry_stub(inputs.image, win.entry_stub, detour.address,
                                    seg.claimed))
    except _WayIn as exc:
        raise _Skip(findings.WINDOW_WAY_IN.code, str(exc)) from None
    except RelocationError as exc:
        raise _Skip(findings.RELOCATION_FAILED.code, str(exc)) from None
    verification = _verified(inputs, win, detour, reps, ways)
    unwind, lsda = _detour_unwind(inputs, sc.probe, win, detour, sb, handling)
    if isinstance(unwind, str):
        seg.found.append(findings.DETOUR_WITHOUT_CFI.finding(f"{sc.probe.probe_id}: {unwind}",
                                                             sc.probe.probe_id))
    else:
        seg.unwind.append(unwind)
    seg.add_code(detour.address, detour.code)
    if lsda is not None:
        seg.add_code(*lsda)
    fill = bytearray(jmp + bytes([INT3]) * (win.size - len(jmp)))
    for a, _off, b, _w in ways:  # a stub in the window's own int3 filler is part of it
        if win.start <= a < win.end:
            fill[a - win.start: a - win.start + len(b)] = b
    seg.patch(win.start, start_off, bytes(fill))
    for a, off, b, _w in ways:
        if not win.start <= a < win.end:
            seg.patch(a, off, b)
    seg.new_args.update(new_args)
    mapping = dict(detour.insn_map)
    returns = tuple((c, r, seen if seen is not None else r) for c, r, seen in
                    return_addresses(win, handling.technique, mapping))
    faults = moved_faults(win, detour)
    for c, r, seen in returns:
        if seen != r:
            seg.found.append(findings.MOVED_CALL_RETURN_ADDRESS.finding(
                f"{sc.probe.probe_id}: the call at {c:#x} is moved into the detour: its callee "
                f"sees the return address {seen:#x} (in the detour), not {r:#x}",
                sc.probe.probe_id))
    n_ways = len(ways) - (win.entry_stub is not None)  # the patches, as before short windows
    reason = (f"{win.shape.value} window of {win.size} bytes relocated to {detour.address:#x}"
              + (f"; {len(win.calls)} call(s) {handling.technique}" if win.calls else "")
              + (", with the detour's own LSDA" if handling.eh is not None else "")
              + (f"; {n_ways} way(s) in retargeted" if n_ways else "")
              + (f"; entered by a jmp rel8 through the stub at {win.entry_stub:#x}"
                 if win.entry_stub is not None else "")
              + observed_text(returns, faults))
    span = WindowSpan.of(win)
    return [SiteDecision(probe=m.probe, code=None,
                         action=Action.DETOUR if m.probe.index == sc.probe.index
                         else Action.MOVED,
                         reason=reason, new_pc=mapping[m.probe.address] + sb.pc_offset,
                         window=win, span=span, detour=detour, guarded=sb.guarded,
                         extra_jumps=win.extra_jumps,
                         calls=handling.technique,
                         retargeted=tuple(w for _a, _o, _b, w in ways),
                         verification=verification, returns=returns, faults=faults)
            for m in members]


def moved_faults(win: PatchWindow, code: Detour) -> tuple[tuple[int, int], ...]:
    """(original pc, pc now) of every instruction of the window that can fault
    (analysis/observed.py) and that the detour or the re-laid window moves."""
    new = dict(code.insn_map)
    return tuple((i.address, new[i.address]) for i in win.insns
                 if i.address != win.probe_address and may_fault(i)
                 and new.get(i.address, i.address) != i.address)


def observed_text(returns: Sequence[tuple[int, int, int]],
                  faults: Sequence[tuple[int, int]]) -> str:
    """What a callee and a signal handler now see, for the site's reason (short)."""
    out = ""
    for _c, r, seen in returns:
        out += (f"; callee sees return {r:#x} (original)" if seen == r else
                f"; callee sees return {seen:#x} in the detour (was {r:#x})")
    if faults:
        out += "; a fault at " + ", ".join(f"{a:#x}" for a, _b in faults) + \
            " is reported at " + ", ".join(f"{b:#x}" for _a, b in faults)
    return out


def _replacements(win: PatchWindow, members: list[SiteCheck], sb: SiteBytes
                  ) -> list[Replacement]:
    """The new site bytes in place of each probe instruction of the window, by address: the
    instruction's real length (a hint-NOP or DS-prefixed nop5 site is 5 bytes; `site.length`
    is None for the forms it does not classify as 1-byte nops)."""
    sizes = {i.address: i.size for i in win.insns}
    first_at: dict[int, SiteCheck] = {}
    for m in members:
        first_at.setdefault(m.probe.address, m)
    return [Replacement(address=a, length=sizes.get(a, first_at[a].probe.site.length or 1),
                        site=sb.code)
            for a in sorted(first_at)]


def _relocated(inputs: _Inputs, seg: _Segment, win: PatchWindow, reps: list[Replacement],
               sb: SiteBytes, emulate: frozenset[int]) -> Detour:
    """The window relocated at the segment's cursor (16-byte aligned), or on the next page
    when a new site would not be optimized where it lands; _Skip when it cannot be. A move
    to the next page moves the cursor even when the site is then skipped."""
    sites = {r.address for r in reps}
    try:
        for _ in range(2):
            at = (seg.cursor + 15) & ~15
            detour = relocate_window(win.code, win.start, reps, at, emulate)
            if all(_optimized(inputs.form, sb, b) for a, b in detour.insn_map if a in sites):
                return detour
            seg.cursor = (at + 4096) & ~4095  # move the detour to the next page
        raise RelocationError("the new site would cross a page")
    except RelocationError as exc:
        raise _Skip(findings.RELOCATION_FAILED.code, str(exc)) from None


def _verified(inputs: _Inputs, win: PatchWindow, detour: Detour, reps: list[Replacement],
              ways: list[tuple[int, int, bytes, str]]) -> str:
    """How the detour was verified (PROVED, EMULATED, NOT_VERIFIED without a verifier), or
    _Skip (`verification-failed`) when it is not equivalent to the window."""
    if inputs.verify is None:
        return NOT_VERIFIED
    extra: dict[str, Any] = {}
    entries = _entries(win, detour)
    if ways or entries:
        extra = {"patches": tuple((a, b) for a, _o, b, _w in ways), "entries": entries}
    why = inputs.verify(inputs.image, win, detour, tuple(r.address for r in reps), **extra)
    verification: str = getattr(inputs.verify, "last_method", EMULATED)
    if why is not None:
        raise _Skip(findings.VERIFICATION_FAILED.code, why, verification)
    return verification


def _detour_unwind(inputs: _Inputs, p: Probe, win: PatchWindow, detour: Detour,
                   sb: SiteBytes, handling: _Calls
                   ) -> tuple[DetourUnwind | str, tuple[int, bytes] | None]:
    """The detour's unwind rows (or why it has none: `detour-without-cfi`) and its own LSDA
    (address, bytes) where it moves a call the function's exception tables cover; _Skip where
    a moved call needs them and they cannot be built."""
    rows = _detour_rows(inputs.cfi, win, detour, sb.guarded, handling.emulate)
    lsda: tuple[int, bytes] | None = None
    eh = handling.eh
    code = findings.WINDOW_CALL_UNWIND.code if handling.technique == MOVED \
        else findings.WINDOW_EH_UNWIND.code
    if eh is not None:
        lsda_at = (detour.end + 3) & ~3
        try:
            lsda = (lsda_at, build_detour_lsda(inputs.image, eh.lsda, lsda_at, detour.address,
                                               _lsda_rows(eh.lsda, win, detour,
                                                          handling.emulate)))
        except UnsupportedError as exc:
            raise _Skip(code, f"the detour's LSDA cannot be built: {exc}") from None
    if isinstance(rows, str) and (eh is not None or (
            handling.technique == MOVED and inputs.cfi.lookup(win.start) is not None)):
        # a moved call returns into the detour: without the detour's FDE, unwinding from
        # the callee would stop there (the original function has one); a fault the LSDA
        # covers would not reach its landing pad
        raise _Skip(code, f"the detour's FDE cannot be built: {rows}")
    if isinstance(rows, str):
        return rows, None
    return DetourUnwind(start=detour.address, end=detour.end,
                        program=fde_program(detour.address, rows),
                        lsda=lsda[0] if lsda is not None else None,
                        personality=eh.personality if eh is not None else None), lsda


def _whole_file(base: RewritePlan, seg: _Segment) -> RewritePlan:
    """The plan of the whole file from its sites' decisions: the new segment, the fork guard
    (added, refused, or none) and the detours' symbols; the findings as the output will have
    them (with the guard added, `fork-guarded` covers the input's `process-can-fork`, and its
    `fork-unknown` where the guard hooks the system calls of unknown number)."""
    image, layout = base.image, base.layout
    assert layout is not None
    guard_only = not seg.patches and _guard_only(image, base.sites, base.fork_guard)
    if not seg.patches and not guard_only:
        return base
    place_at = (seg.text_addr + len(seg.text) + 15) & ~15  # the fork guard's place
    fork, refusal = _fork_guard(image, base.form, base.sites, base.fork_guard, place_at)
    symbols = _symbols(image, detour_symbols(base.sites)
                       + list(fork.symbols if fork is not None else ()), layout,
                       dynamic_symbols(image, base.sites))
    said = [*base.findings]
    if symbols.left_out is not None:
        said.append(symbols.left_out)
    dwarf, left_out = _detour_debug(image, base.sites,
                                    fork is not None and bool(fork.hooked))
    said += left_out
    if fork is not None:
        entry = dict(fork.marker)
        span = entry.get("table")
        count = (span[1] - span[0]) // 12 if isinstance(span, list) else 0
        covered = {findings.PROCESS_CAN_FORK.code} | \
            ({findings.FORK_UNKNOWN.code} if fork.checks_numbers else set())
        said = [f for f in said if f.code not in covered]
        said.append(findings.FORK_GUARDED.finding(
            f"fork guard added for {count} site(s): a forked child puts them back on the int3 "
            f"path; the output registers it when it loads, through {entry.get('hook')}"))
    return replace(base, findings=tuple(said), text_addr=seg.text_addr,
                   text=bytes(seg.text), unwind=tuple(seg.unwind), patches=tuple(seg.patches),
                   new_args=tuple(sorted(seg.new_args.items())), guard_only=guard_only,
                   fork_refusal=refusal, fork_guard_code=fork, symbols=symbols,
                   unwind_tables=_unwind_tables(image, seg.unwind), dwarf=dwarf)


def _detour_debug(image: ElfImage, sites: tuple[SiteDecision, ...], hooked: bool = False
                  ) -> tuple[DwarfToExtend | None, list[Finding]]:
    """For a file whose code is rewritten: the DWARF the detours' compile unit extends and
    whose line rows inside the windows move (analysis/debuglines.py refused every window
    with a row inside where they cannot; `hooked`: the fork guard moves system calls to its
    hooks), and what says that a table of the detours' is left out
    (`detour-unwind-left-out`, as check says it; `detour-dwarf-left-out`)."""
    detours = any(d.action is Action.DETOUR for d in sites)
    if not detours and not hooked and not any(d.action is Action.IN_PLACE for d in sites):
        return None, []
    said = [f for f in (detour_unwind_left_out(image),) if f is not None] if detours else []
    said += debug_file_stale(image)
    got = read_for_detours(image)
    if isinstance(got, str):
        if detours:
            said.append(findings.DETOUR_DWARF_LEFT_OUT.finding(
                f"the detours get no DWARF (no compile unit, no line rows): {got}"))
        return None, said
    return got, said


def debug_file_stale(image: ElfImage) -> list[Finding]:
    """`debug-file-stale` for a file whose code the rewrite changes and whose debug
    information was split off before (no `.debug_info`, a `.gnu_debuglink`: gdb finds that
    file by its name and CRC whatever the build-id): it describes the original code, so a
    line row inside a rewritten window, which the rewrite cannot see there, makes gdb's
    `break FILE:LINE` put an int3 inside the moved code (SIGILL), and the detours have no
    lines (docs/rewrite.md, "Debugging information")."""
    link = image.section(".gnu_debuglink")
    if link is None or image.section(".debug_info") is not None:
        return []
    raw = image.section_data(link)
    name = raw[: raw.find(b"\0")] if b"\0" in raw else raw
    return [findings.DEBUG_FILE_STALE.finding(
        f"its debug information is in a separate file ({name.decode('utf-8', 'replace')}, "
        f"named by .gnu_debuglink) that describes the original code: where gdb finds it for "
        f"the output (by that link, whatever the build-id), its line rows inside the "
        f"rewritten windows are wrong and the detours have none")]


def _unwind_tables(image: ElfImage, unwind: list[DetourUnwind]) -> UnwindTables | None:
    """Whether and where the detours' unwind rows go (UnwindTables), or None."""
    eh = image.section(".eh_frame")
    if not unwind or eh is None or not eh.addr or eh_frame_unindexed(image) is not None:
        return None
    old = image.section(".debug_frame")
    plain = old is None or (old.type == SHT_PROGBITS
                            and not old.flags & (SHF_ALLOC | SHF_COMPRESSED))
    return UnwindTables(eh_frame=eh.addr, debug_frame=plain)


def output_nop5_sites(image: ElfImage, form: Form, sites: tuple[SiteDecision, ...]
                      ) -> tuple[tuple[int, bytes], ...]:
    """Every NOP the kernel will optimize in the output: (vaddr, its bytes in the output):
    the rewritten sites (at their new pc) and the sites that already were 5-byte NOPs."""
    off = form.optimized_offset
    out = [(s.new_pc + off, form.bytes[off : off + form.optimized_length])
           for s in sites if s.status is Status.REWRITTEN and s.new_pc is not None]
    out += existing_nop5_sites(image, sites)
    return tuple(sorted(out))


def _fork_guard(image: ElfImage, form: Form, sites: tuple[SiteDecision, ...],
                fork_guard: ForkGuard, place_at: int) -> tuple[ForkGuardCode | None, str | None]:
    """THE FORK GUARD SEAM (docs/fork-guard.md): the guard's code to add at `place_at` (just
    after the detours in the new segment, 16-byte aligned) or None, and why the rewrite is
    refused (None: it is not).

    usdtpatch.forkguard.build_guard builds it for every NOP the output's kernel optimizes
    (output_nop5_sites; sites a 6.18 kernel never optimizes, such as combo10's, need none).
    --fork-guard auto adds it to a file whose process may fork a copy of itself
    (forkguard.fork_exposure: it calls fork and the like, or it is a shared object), always to
    every file; a file that needs it and cannot carry it is refused unless --fork-guard never.
    """
    if fork_guard is ForkGuard.NEVER:
        return None, None
    exposure = forkguard.fork_exposure(image)
    if fork_guard is ForkGuard.AUTO and exposure is None:
        return None, None
    try:
        g = forkguard.build_guard(image, output_nop5_sites(image, form, sites), place_at)
    except forkguard.GuardUnsupported as exc:
        why = exposure or "--fork-guard always"
        return None, (f"the fork guard cannot be added ({exc}) and the optimized sites would "
                      f"crash a forked child ({why}): rewrite with --fork-guard never to "
                      f"accept that")
    if g.empty:
        return None, None
    return ForkGuardCode(address=place_at, text=g.text, patches=g.patches, symbols=g.symbols,
                         marker=tuple(forkguard.marker_entry(g).items()),
                         checks_numbers=g.checked > 0, hooked=g.hooked), None


def text_section_index(image: ElfImage) -> int:
    """The section index of `.usdtpatch.text` in the output: the first section it adds
    (usdtpatch.elf.writer.added_sections_index: after the last allocated original)."""
    return added_sections_index(image)


@dataclass(frozen=True, slots=True, kw_only=True)
class DetourSymbols:
    """The local STT_FUNC symbols the output adds (name, address, size: the detours', then
    the fork guard's) and where they go: `.symtab` grown where it is (`in_place`), a new copy
    of it at the end, or nowhere (`left_out`, the finding that says why)."""

    symbols: tuple[tuple[str, int, int], ...]
    in_place: SymtabInPlace | None = None
    left_out: Finding | None = None
    # the detours' `.dynsym` entries (name, address, size: dynamic_symbols)
    dynamic: tuple[tuple[str, int, int], ...] = ()


def detour_symbols(sites: tuple[SiteDecision, ...]) -> list[tuple[str, int, int]]:
    """(name, address, size) of the local STT_FUNC symbol of each detour, named as compilers
    name the split-off parts of a function (`f.cold`, `f.part.0`): `f.usdtpatch.N`, N
    counting f's detours from 0, so that backtraces and profilers without debug information
    still name the original function f; `__usdtpatch_detour_<provider>_<name>_<index>` where
    the site's function has no symbol."""
    out = []
    count: dict[str, int] = {}
    for o in sites:
        if o.action is Action.DETOUR and o.detour is not None:
            fn = o.probe.function
            if fn:
                name = f"{fn}.usdtpatch.{count.get(fn, 0)}"
                count[fn] = count.get(fn, 0) + 1
            else:
                name = f"{DETOUR_PREFIX}{o.probe.provider}_{o.probe.name}_{o.probe.index}"
            out.append((name, o.detour.address, len(o.detour.code)))
    return out


def dynamic_symbols(image: ElfImage, sites: tuple[SiteDecision, ...]
                    ) -> list[tuple[str, int, int]]:
    """(name, address, size) of the `.dynsym` entry of each detour whose window lies in a
    function `.dynsym` names (usdtpatch.elf.dynsym: a stripped file names the frame by it):
    `<that name>.usdtpatch.N`, as detour_symbols names it; none in a file whose `.dynsym`
    cannot grow (dynsym_left_out)."""
    detours = [o for o in sites if o.action is Action.DETOUR and o.detour is not None]
    if not detours or dynsym_left_out(image) is not None:
        return []
    out = []
    count: dict[str, int] = {}
    names = exported_functions(image, [o.probe.address for o in detours])
    for o, fn in zip(detours, names, strict=True):
        assert o.detour is not None
        if fn is not None:
            out.append((f"{fn}.usdtpatch.{count.get(fn, 0)}", o.detour.address,
                        len(o.detour.code)))
            count[fn] = count.get(fn, 0) + 1
    return out


def _symbols(image: ElfImage, syms: list[tuple[str, int, int]], layout: SegmentLayout,
             dynamic: list[tuple[str, int, int]]) -> DetourSymbols:
    """Where the added symbols go: `.symtab` grown in place when it can be
    (usdtpatch.elf.symbols.symtab_in_place: names must end before the new segment; past the
    `cut` of the input, usdtpatch.elf.writer.plan_segment, the table grows in the writer's copy
    of the input's end, with no limit, unless it would straddle the cut), else a copy at the
    end unless that is refused (`_symtab_copy_refused`)."""
    limit, cut = layout.offset, layout.cut
    grown = symtab_in_place(image, syms, text_section_index(image),
                            limit if cut is None else 1 << 62)
    if grown is not None and cut is not None and any(
            at < cut < at + len(data) or (at < cut and at + len(data) > limit)
            for at, data in ((grown.symtab_offset, grown.prefix), (grown.names_at, grown.names))):
        grown = None  # it would straddle the cut
    if grown is not None:
        return DetourSymbols(symbols=tuple(syms), in_place=grown, dynamic=tuple(dynamic))
    return DetourSymbols(symbols=tuple(syms), left_out=_symtab_copy_refused(image),
                         dynamic=tuple(dynamic))


SYMTAB_COPY_FLOOR = 64 << 10  # a table this small is copied whatever the file's size


def _symtab_copy_refused(image: ElfImage) -> Finding | None:
    """`detour-symbols-left-out` when `.symtab` cannot grow in place and copying it and its
    strings to the end would grow the file by more than 1% (and 64 KiB): a file grows by at
    most its detours, their tables and 1% (issue 22), and a 10-million-entry table is not
    copied (issue 20, item 11: 2.4 GB of memory, a file twice its size)."""
    old = image.section(".symtab")
    if old is None or old.type != SHT_SYMTAB or not 0 < old.link < len(image.sections):
        return None  # a new, small table
    copied = old.size + image.sections[old.link].size
    budget = max(SYMTAB_COPY_FLOOR, len(image.data) // 100)
    if copied <= budget:
        return None
    return findings.DETOUR_SYMBOLS_LEFT_OUT.finding(
        f".symtab ({old.size // 24} entries) cannot grow where it is, and copying it with its "
        f"strings ({copied} bytes) would grow the file by more than {budget} bytes (1%): the "
        f"detours are left without symbols")


def _guard_only(image: ElfImage, sites: tuple[SiteDecision, ...], fork_guard: ForkGuard
                ) -> bool:
    """Whether a file with nothing to rewrite still gets the fork guard: its sites already are
    5-byte NOPs the kernel optimizes, it carries no guard of its own (sys/sdt.h's), and it may
    fork (`auto`) or the guard is asked for (`always`). Then `rewrite` adds only the guard (or
    refuses the file when the guard cannot be added), rather than copy an unguarded file."""
    if fork_guard is ForkGuard.NEVER:
        return False
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
                FORMS[form].nop_length == 5:
            at = s.probe.address + FORMS[form].nop_at
            out.append((at, bytes(image.read_vaddr(at, 5))))
    return out


def _lsda_rows(lsda: Lsda, win: PatchWindow, detour: Detour,
               emulated: frozenset[int] = frozenset()) -> list[LsdaRow]:
    """The detour's call-site rows: each relocated instruction with its original row (a
    moved call's return address with the row of the original's)."""
    order = list(detour.insn_map)
    spans: list[tuple[int, int, int, int, bool]] = []
    ends = {i.address: i.end for i in win.insns}
    moved = set(win.calls) - emulated
    for (orig, new), (_next_orig, next_new) in pairwise(order):
        if orig in ends:
            spans.append((orig, ends[orig], new, next_new, orig in moved))
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


def _entry_stub(image: ElfImage, stub: int, detour: int, claimed: Claims
                ) -> tuple[int, int, bytes, str]:
    """The edit writing a short window's `jmp rel32` stub to its detour (analysis/windows.py
    chose the place), or _WayIn when another rewritten site's window or stub holds it."""
    if claimed.overlaps(stub, stub + 5):
        raise _WayIn(f"the entry stub at {stub:#x} lies in another rewritten site's window")
    off = image.vaddr_to_offset(stub)
    if off is None:
        raise RelocationError(f"the entry stub at {stub:#x} is not in the file")
    return stub, off, jmp_rel32(stub, detour), f"entry stub at {stub:#x}"


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


def _page_crossing_window(p: Probe) -> PatchWindow:
    """The window of a nop5 site that crosses a page: the nop5 alone, moved to a detour where
    it does not cross one (a jmp rel32 fills its 5 bytes exactly)."""
    code = p.code[:5]
    return PatchWindow(shape=WindowShape.FORWARD, start=p.address, end=p.address + 5,
                       probe_address=p.address, probe_length=5,
                       insns=sweep(code, p.address).insns, code=code, replacement=None,
                       relocated_bytes=5, extra_jumps=2,
                       start_reason="the probe's nop5, which crosses a 4 KiB page",
                       end_reason="the end of the nop5", targets_at_start=(),
                       internal_targets=(), function_start=p.address,
                       function_end=p.address + 5)


def _detour_rows(cfi: CfiIndex, win: PatchWindow, detour: Detour,
                 guarded: bool, emulated: frozenset[int] = frozenset()
                 ) -> list[tuple[int, Row]] | str:
    fde = cfi.lookup(win.start) or debug_frame_fde(cfi.image, win.start)
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
