"""`check`: every probe site of one file judged as an optimization candidate (one pure function).

check(probeset) -> CheckReport ties together the kernel's verdict matrix (candidacy), function
bounds and branch targets (functions, targets), patch windows (windows) and hazards. Each
function holding a probe is disassembled once, whatever the number of its probes.
The finding codes are documented in docs/findings.md.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from usdtpatch.analysis.calls import (
    CALLS_AUTO,
    MOVED,
    Refusal,
    detour_handling,
    return_addresses,
    shadow_stack_marked,
)
from usdtpatch.analysis.candidacy import Candidacy, Outcome, site_candidacy
from usdtpatch.analysis.closed import file_refusal, local_refusal
from usdtpatch.analysis.computed import file_ways_in
from usdtpatch.analysis.debuglines import entry_pinned, window_debug_refusal
from usdtpatch.analysis.forkexposure import exposure, fork_exposure
from usdtpatch.analysis.forms import (
    ForkGuard,
    Form,
    Guard,
    guard_args,
    kept_as_is,
    site_bytes,
    uses_numeric_rip,
)
from usdtpatch.analysis.functions import FunctionBounds
from usdtpatch.analysis.guardfile import coverage, is_shared
from usdtpatch.analysis.hazards import (
    CLOBBERED,
    FORK_COPIES_MM,
    RedZone,
    RseqCs,
    StackMemo,
    detour_unwind_left_out,
    fork_evidence,
    imported_fork_family,
    red_zone,
    remember_context,
    rseq_sections,
    semaphore_problems,
)
from usdtpatch.analysis.index import Claims  # the planner's claim index (check decides as it does)
from usdtpatch.analysis.merge import join_following
from usdtpatch.analysis.observed import NO_OBSERVERS, PcObservers, pc_observers
from usdtpatch.analysis.probes import Probe, ProbeSet
from usdtpatch.analysis.relay import Relaid, relay
from usdtpatch.analysis.rules import optimized_where_it_is
from usdtpatch.analysis.targets import CodeContext, FunctionCode
from usdtpatch.analysis.waysin import AFTER, BEFORE, WaysIn
from usdtpatch.analysis.windows import (
    STUB_SIZE,
    PatchWindow,
    Pinned,
    SameRow,
    WindowResult,
    WindowShape,
    find_window,
)
from usdtpatch.elf.args import MemOperand
from usdtpatch.elf.cfi import CfiError, CfiIndex, load_cfi
from usdtpatch.elf.ehframe import rows_at
from usdtpatch.elf.image import ElfImage
from usdtpatch.elf.symbols import SymbolTable, load_symbols
from usdtpatch.errors import UnsupportedError
from usdtpatch.findings import (
    ARG_RIP_RELATIVE,
    ARG_USES_RIP,
    ARG_USES_RSP,
    CFI_MALFORMED,
    FORK_GUARD_UNAVAILABLE,
    FORK_GUARDED,
    FORK_UNKNOWN,
    GUARD_IMPOSSIBLE,
    MOVED_CALL_RETURN_ADDRESS,
    NO_TRAMPOLINE_REACH,
    PROCESS_CAN_FORK,
    RED_ZONE_LIVE,
    RED_ZONE_REWRITE,
    SITE_COMBO5_PC1,
    SITE_CROSSES_PAGE,
    SITE_ELF32,
    SITE_HINT_NOP,
    SITE_IN_RSEQ_CS,
    SITE_SEGMENT_PREFIX,
    WINDOW_BRANCH_TARGET,
    WINDOW_NO_FUNCTION_BOUNDS,
    WINDOW_OVERLAPS_SITE,
    WINDOW_WAY_IN,
    Finding,
    Severity,
    lookup,
)
from usdtpatch.kernelfacts import DEFAULT
from usdtpatch.x86.decode import CodeInsn
from usdtpatch.x86.nops import FORMS, nop5_offset

# Site outcomes, in the order the summary lists them.
OPTIMIZABLE = "optimizable"
IN_PLACE = WindowShape.IN_PLACE.value
FORWARD = WindowShape.FORWARD.value
BACKWARD = WindowShape.BACKWARD.value
BLOCKED = "blocked"
NOT_APPLICABLE = "n/a"
OUTCOMES = (OPTIMIZABLE, IN_PLACE, FORWARD, BACKWARD, BLOCKED, NOT_APPLICABLE)

# The kernel verdicts check reports as findings (with the registry's severity and hint).
_KERNEL_FINDINGS = frozenset(c.code for c in (
    SITE_CROSSES_PAGE, SITE_SEGMENT_PREFIX, SITE_HINT_NOP, SITE_ELF32, NO_TRAMPOLINE_REACH,
    SITE_COMBO5_PC1))


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """The options of `rewrite` its decisions depend on, for check to predict them (the
    defaults are rewrite's for the default generation's target): the site form, the red-zone
    guard, how a window's calls are handled (usdtpatch.analysis.calls.CALL_CHOICES) and the
    fork guard."""

    form: Form = Form.NOP5
    guard: Guard = Guard.AUTO
    calls: str = CALLS_AUTO
    fork_guard: ForkGuard = ForkGuard.AUTO


DEFAULT_OPTIONS = CheckOptions()


@dataclass(frozen=True, slots=True)
class SiteCheck:
    """The verdict on one probe site."""

    probe: Probe
    candidacy: Candidacy
    outcome: str  # one of OUTCOMES
    blocked: str | None  # the finding code that blocks it (outcome BLOCKED)
    window: WindowResult | None
    red_zone: RedZone | None
    function: FunctionBounds | None
    findings: tuple[Finding, ...]


@dataclass(frozen=True, slots=True)
class CheckReport:
    """check()'s result for one file."""

    probeset: ProbeSet = field(repr=False)
    sites: tuple[SiteCheck, ...]
    findings: tuple[Finding, ...]  # file-level, including `list`'s findings
    fork_imports: tuple[str, ...]
    cfi_source: str
    cfi_fdes: int
    # the symbols, CFI and analysed functions check used: `show` and the HTML report reuse them
    context: CodeContext = field(repr=False, compare=False)
    options: CheckOptions = DEFAULT_OPTIONS  # the rewrite options the outcomes predict

    @property
    def all_findings(self) -> tuple[Finding, ...]:
        return self.findings + tuple(f for s in self.sites for f in s.findings)

    def outcome_counts(self) -> dict[str, int]:
        c = Counter(s.outcome for s in self.sites)
        return {o: c.get(o, 0) for o in OUTCOMES}

    def blocked_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(s.blocked for s in self.sites if s.blocked).items()))


# What a caller keeps of each site's check once its decision is final (check's `keep`).
Keep = Callable[[SiteCheck], SiteCheck]

# How far behind the walk in address order a site's decision is final: a window taken for a
# later site starts at most BEFORE bytes before its probe (the ways-in index knows no way in
# further back, so no window reaches there), and a window that moves a site along starts at
# or before it. _InOrder.between checks it of every window the walk asks about.
SETTLED = 4 * BEFORE


def check(probeset: ProbeSet, symbols: SymbolTable | None = None,
          options: CheckOptions = DEFAULT_OPTIONS,
          guard_builder: GuardBuilder | None = None, keep: Keep | None = None,
          context: Callable[[CodeContext], None] | None = None) -> CheckReport:
    """Judge every probe site of `probeset`; pure: no I/O, findings instead of exceptions.
    The outcomes are what `rewrite` with `options` decides; with `guard_builder`, also
    whether rewrite refuses the file for a fork guard it cannot add. `keep`, when given, is
    called with each site's check once its decision is final (in address order) and the
    report's sites are what it returns: a writer makes the site's entry there and keeps a
    smaller SiteCheck (the file's own findings read only each site's probe, outcome and
    findings), so that no window is held past its site. `context`, when given, is called
    with the file's analysis context before the first site is checked (rewrite's plan,
    decided as the sites are kept, asks it too)."""
    image = probeset.image
    findings: list[Finding] = list(probeset.findings)
    if symbols is None:
        symbols = probeset.symbols if probeset.symbols is not None else load_symbols(image)
    try:
        cfi = load_cfi(image)
    except CfiError as exc:
        findings.append(CFI_MALFORMED.finding(f"call frame information unusable: {exc}",
                                              ".eh_frame_hdr"))
        cfi = CfiIndex(image, (), (), "none")
    ctx = CodeContext(image, cfi, symbols)
    ctx.ways_in = _ways_in_index(ctx, probeset)
    ctx.observers = _observers(ctx, probeset)
    remember_context(ctx)
    if context is not None:
        context(ctx)
    rseq = rseq_sections(ctx) if probeset.probes else ()
    ctx.rseq_aborts = tuple(r.abort for r in rseq)
    forks = imported_fork_family(image) if probeset.probes else ()
    stacks = StackMemo()
    sites = _together(ctx, _InOrder(probeset.probes,
                                    lambda p: _check_site(ctx, p, rseq, stacks)), options, keep)
    findings.extend(_fork_findings(image, sites, forks))
    if not any(f in FORK_COPIES_MM for f in forks):
        findings.extend(_code_fork_findings(ctx, sites))
    if not any(f.code == PROCESS_CAN_FORK.code for f in findings):
        findings.extend(_route_fork_findings(image, sites))
    findings.extend(_library_syscall_findings(ctx, sites))
    unwind = detour_unwind_left_out(image) if any(
        s.outcome in (FORWARD, BACKWARD) for s in sites) else None
    if unwind is not None:
        findings.append(unwind)
    if options.fork_guard is not ForkGuard.NEVER and guard_builder is not None:
        findings.extend(_guard_unavailable(image, sites, options.fork_guard, guard_builder))
    return CheckReport(probeset=probeset, sites=sites, findings=tuple(findings), fork_imports=forks,
                       cfi_source=cfi.source, cfi_fdes=len(cfi), context=ctx, options=options)


def _ways_in_index(ctx: CodeContext, probeset: ProbeSet) -> WaysIn:
    """The file-wide index of ways into the code around every probe (built once per file)."""
    sites: list[tuple[int, int, int]] = []
    for p in probeset.probes:
        b = ctx.bounds(p.address)
        sites.append((p.address, b.start, b.end) if b is not None else
                     (p.address, p.address, p.address))
    starts = sorted({*ctx.cfi.starts, *ctx.symbols.addresses})
    return file_ways_in(ctx, sites, starts)


def _observers(ctx: CodeContext, probeset: ProbeSet) -> PcObservers:
    """Who observes a moved pc in the file (analysis/observed.py), for the code around every
    probe: its function's start and the bytes a window of it may cover."""
    regions = []
    for p in probeset.probes:
        b = ctx.bounds(p.address)
        if b is not None:
            regions.append((b.start, p.address - BEFORE, min(b.end, p.address + AFTER)))
    return pc_observers(ctx.image, regions) if regions else NO_OBSERVERS


def _fork_findings(image: ElfImage, sites: tuple[SiteCheck, ...],
                   forks: tuple[str, ...]) -> list[Finding]:
    """The fork hazard of the file: covered by a fork guard (usdtpatch.forkguard: built with
    sys/sdt.h's, or added by rewrite), or `process-can-fork`, and whether rewrite could add
    the guard (docs/fork-guard.md)."""

    out: list[Finding] = []
    exposed = [s for s in sites if s.outcome not in (NOT_APPLICABLE, BLOCKED)]
    if not exposed:
        return out
    optimized = {s.probe.address + nop5_offset(s.probe.site.form)
                 for s in sites if s.outcome == OPTIMIZABLE}
    cov = coverage(image)
    if cov is not None and optimized <= cov.sites:
        out.append(FORK_GUARDED.finding(
            f"{len(optimized)} optimizable site(s), every one in the fork guard's table "
            f"({len(cov.sites)} entries): a forked child puts them back on the int3 path; "
            f"{cov.how}"))
        return out
    if forks:
        now = sum(1 for s in sites if s.outcome == OPTIMIZABLE)
        copying = [f for f in forks if f in FORK_COPIES_MM]
        shared = "" if copying else (" (each of these runs the child in the parent's address "
                                     "space until exec: exposed only if the child reaches a "
                                     "site before exec)")
        out.append(PROCESS_CAN_FORK.finding(
            f"the file uses {', '.join(forks)}{shared}: a child forked while a site is optimized "
            f"inherits the call to the trampoline but not its page and dies with SIGSEGV at the "
            f"site ({now} site(s) optimizable as they are, {len(exposed) - now} after rewrite)",
            severity=Severity.ERROR if now and copying else Severity.WARNING))
    return out


def _route_fork_findings(image: ElfImage, sites: tuple[SiteCheck, ...]) -> list[Finding]:
    """`process-can-fork` for a file that names no fork of its own but may be forked all the
    same (usdtpatch.analysis.forkexposure, what rewrite's `--fork-guard auto` asks too): an
    executable that loads a library other than the C library's (or calls dlopen), or one that
    looks functions up with dlsym / dlvsym. A shared object is guarded by rewrite whatever it
    calls (any process may load it) and check does not warn of every one."""
    exposed = [s for s in sites if s.outcome not in (NOT_APPLICABLE, BLOCKED)]
    if not exposed or coverage(image) is not None:
        return []
    got = exposure(image)
    if got is None or got.route not in ("libraries", "lookup"):
        return []
    now = sum(1 for s in sites if s.outcome == OPTIMIZABLE)
    return [PROCESS_CAN_FORK.finding(
        f"{got.reason}: a child forked while a site is optimized inherits the call to the "
        f"trampoline but not its page and dies with SIGSEGV at the site ({now} site(s) "
        f"optimizable as they are, {len(exposed) - now} after rewrite)", severity=Severity.WARNING)]


@dataclass(frozen=True, slots=True)
class GuardBuilder:
    """What check asks the fork guard's builder, to predict rewrite's refusal: why the guard
    could not be added (forkguard.hook_problem: what building it says). Whether the file may
    fork is analysis/forkexposure.py's, asked by both. The builder sits above this module (it
    reads the site analysis), so the library hands it in (api.check)."""

    hook_problem: Callable[[ElfImage], str | None]


def _guard_unavailable(image: ElfImage, sites: tuple[SiteCheck, ...],
                       fork_guard: ForkGuard, builder: GuardBuilder) -> list[Finding]:
    """`fork-guard-unavailable` where rewrite refuses the file: it may fork (with
    --fork-guard always, any file) and the guard cannot be added."""
    if not any(s.outcome not in (NOT_APPLICABLE, BLOCKED) for s in sites) or \
            coverage(image) is not None:
        return []
    why = fork_exposure(image)
    if why is None and fork_guard is ForkGuard.ALWAYS:
        why = "--fork-guard always"
    problem = builder.hook_problem(image) if why is not None else None
    if problem is None:
        return []
    return [FORK_GUARD_UNAVAILABLE.finding(
        f"the file may fork ({why}), but the fork guard cannot be added: {problem}; "
        f"rewrite --fork-guard {fork_guard.value} refuses the file (--fork-guard never "
        f"accepts the risk)")]


class _InOrder:
    """Each site's own check (`make`), made when the walk in address order first needs it:
    the walk decides a site right after its function was analysed for the site's own check,
    while the function memo still holds it (made all first, a file of more sites than the
    memo keeps analysed every function twice). The checks do not depend on the order they
    are made in (each is a function of the file and the site)."""

    def __init__(self, probes: tuple[Probe, ...], make: Callable[[Probe], SiteCheck]) -> None:
        self.probes = probes
        self.order = sorted(probes, key=lambda p: p.address)  # stable: ties in note order
        self.addresses = [p.address for p in self.order]
        self.made: list[SiteCheck] = []
        self.make = make
        self.settled = 0  # the sites before this one (address order) are given to `keep`

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, k: int) -> SiteCheck:
        return self.at(k)

    def at(self, k: int) -> SiteCheck:
        """The check of the k-th site in address order (and of every site before it)."""
        while len(self.made) <= k:
            self.made.append(self.make(self.order[len(self.made)]))
        return self.made[k]

    def between(self, lo: int, hi: int) -> list[SiteCheck]:
        """The checks of the sites with lo <= address < hi, in address order."""
        i, j = bisect_left(self.addresses, lo), bisect_left(self.addresses, hi)
        if i < self.settled and j > i:  # SETTLED too small: a decision would have changed
            raise AssertionError(f"a window at {lo:#x} reaches a settled site")
        if j > i:
            self.at(j - 1)
        return self.made[i:j]

    def in_note_order(self) -> tuple[SiteCheck, ...]:
        """Every site's check, in the order of the probes (the notes)."""
        if self.order:
            self.at(len(self.order) - 1)
        by_index = {sc.probe.index: sc for sc in self.made}
        return tuple(by_index[p.index] for p in self.probes)


def _together(ctx: CodeContext, made: _InOrder, options: CheckOptions = DEFAULT_OPTIONS,
              keep: Keep | None = None) -> tuple[SiteCheck, ...]:
    """The sites as rewrite (with `options`) decides them together, walking them in address
    order as usdtpatch.rewriter.plan does: a site already in the target's form is left as it
    is (`optimizable`); the sites inside one window go along with the first (one detour;
    `in-place` only for a window that holds one site, needs no red-zone guard and holds the
    new site's bytes where the kernel optimizes them, else the window moves to a detour:
    `forward`); a window overlapping one already taken is not used (`window-overlaps-site`);
    nor one whose calls can neither move nor be emulated (usdtpatch.analysis.calls,
    `window-call-unwind`), one whose instructions need exception tables the detour cannot
    get (`window-eh-unwind`), one whose guarded site's arguments cannot follow the guard
    (`guard-impossible`), one that would move an argument read relative to rip
    (`arg-rip-relative`), or one with a debugger's breakpoint address inside that the
    rewrite does not keep true (analysis/debuglines.py: `window-line-row`,
    `window-debug-entry`). With `keep` (check's), each site is given to it once the walk is
    SETTLED bytes past it, and what it returns replaces the site's check."""
    shstk: list[bool] = []
    decided: dict[int, SiteCheck] = {}
    kept: dict[int, SiteCheck] = {}
    claimed = Claims()  # overlap tests by bisection: a scan per site was quadratic

    def settle(before: int | None) -> None:
        """Give `keep` the sites more than SETTLED bytes before `before` (None: all)."""
        assert keep is not None
        while made.settled < len(made.made) and (
                before is None or made.addresses[made.settled] + SETTLED < before):
            index = made.made[made.settled].probe.index
            made.made[made.settled] = kept[index] = keep(
                decided.pop(index, made.made[made.settled]))
            made.settled += 1

    for k in range(len(made)):
        if keep is not None:
            settle(made.addresses[k])
        sc = made.at(k)
        if sc.probe.index in decided:
            continue
        if _in_target_form(sc, options.form):
            if sc.outcome != OPTIMIZABLE:
                decided[sc.probe.index] = replace(sc, outcome=OPTIMIZABLE, blocked=None)
            continue
        w = sc.window.window if sc.window is not None else None
        if w is None or sc.outcome not in (IN_PLACE, FORWARD, BACKWARD):
            continue
        relaid = relaid_window(ctx, sc, w, claimed, options.form, options.guard, made.between)
        if relaid is not None and sc.window is not None:
            decided[sc.probe.index] = replace(
                sc, outcome=IN_PLACE, blocked=None,
                window=replace(sc.window, window=relaid.window, fallback=w,
                               tried=(*sc.window.tried, "re-laid: ok")))
            claimed.append((relaid.window.start, relaid.window.end))
            continue
        w = join_following(w, made, k)  # as rewriter/plan.py joins, after the re-laid try
        members = made.between(w.start, w.end)
        w = used_window(w, sc.probe, [m.probe for m in members], options.form, any(
            needs_red_zone_guard(m, options.guard, options.form) for m in members))
        why = _window_refused(ctx, sc, w, members, claimed, options, shstk)
        if why is not None:
            code, reason = why
            decided[sc.probe.index] = replace(
                sc, outcome=BLOCKED, blocked=code,
                findings=(*sc.findings, lookup(code).finding(reason, sc.probe.probe_id)))
            continue
        shape = w.shape.value
        for m in members:
            decided[m.probe.index] = _used(m, shape, w)
        said = _moved_calls(ctx, sc, w, options, shstk)
        if said:
            first = decided[sc.probe.index]
            decided[sc.probe.index] = replace(first, findings=(*first.findings, *said))
        claimed.append((w.start, w.end))
        claimed.extend((r.source, r.source + 1) for r in w.retargets)
        # a stub outside the window is written as the plan writes it (it claims it too)
        claimed.extend((a, a + STUB_SIZE) for a in _stubs_outside(w))
    if keep is not None:
        settle(None)
        return tuple(kept[p.index] for p in made.probes)
    return tuple(decided.get(s.probe.index, s) for s in made.in_note_order())


def relaid_window(ctx: CodeContext, sc: SiteCheck, w: PatchWindow, claimed: Claims,
                  form: Form, guard: Guard,
                  sites_between: Callable[[int, int], list[SiteCheck]]) -> Relaid | None:
    """The site's window re-laid where it is (analysis/relay.py), preferred to a detour,
    when its detour window `w` is not in place already, the site needs no red-zone guard
    (the guard needs a detour), and the re-laid window holds no other site and overlaps no
    window taken; else None. rewriter/plan.py asks the same."""
    if w.shape is WindowShape.IN_PLACE or needs_red_zone_guard(sc, guard, form) or \
            sc.window is None or sc.window.window is None:
        return None
    sb = site_bytes(form, False)
    got = relay(ctx, sc.probe, sb.code, sb.optimized_offset, gen=form.kernel)
    if isinstance(got, str) or claimed.overlaps(got.window.start, got.window.end) or \
            [m.probe.address for m in sites_between(got.window.start, got.window.end)] \
            != [sc.probe.address] or \
            window_debug_refusal(ctx.image, got.window.start, got.window.end) is not None:
        return None
    if ctx.observers is not None:  # what must keep its pc keeps it (analysis/observed.py)
        pinned = ctx.observers.pinned(w.function_start)
        moved = {a for a, b in got.code.insn_map if a != b}
        if any(i.address in moved and pinned(i) is not None for i in got.window.insns):
            return None
    return got


def _pinned(ctx: CodeContext, function_start: int) -> Pinned | None:
    """What must not move in the function (find_window's test): what observes a pc
    (analysis/observed.py), then a debugger's breakpoint at a DIE (analysis/debuglines.py)."""
    observed = ctx.observers.pinned(function_start) if ctx.observers is not None else None
    entries = entry_pinned(ctx.image)
    if observed is None or entries is None:
        return observed or entries

    def test(ins: CodeInsn) -> tuple[str, str] | None:
        return observed(ins) or entries(ins)
    return test


def same_row(ctx: CodeContext) -> SameRow | None:
    """find_window's test of a stub's place inside a function: the `.eh_frame` row in force
    there is the one at the target (one FDE covers both, its program replays). None (no stub
    inside a function) for a file with `.debug_frame`, whose rows are not read (a debugger
    unwinding through the stub would read those)."""
    if ctx.image.section(".debug_frame") is not None:
        return None

    def test(at: int, target: int) -> bool:
        try:
            fde = ctx.cfi.lookup(at)
            if fde is None or not fde.contains(target):
                return False
            rows = rows_at(fde, sorted({at, target}))
        except (CfiError, UnsupportedError):  # rows that do not read: no stub there
            return False
        return rows[at] == rows[target]
    return test


def _in_target_form(sc: SiteCheck, form: Form) -> bool:
    """Whether rewrite leaves the site as it is for `form` (analysis.forms.left_as_is, as
    rewriter/plan.py asks) though the default generation's rules, which judged it, do not
    optimize it: a 10-byte NOP site for a nop10 target (--form combo10)."""
    facts = FORMS[sc.probe.site.form]
    return kept_as_is(facts, form) and DEFAULT.name not in facts.kept_by \
        and sc.outcome != NOT_APPLICABLE


def needs_red_zone_guard(sc: SiteCheck, guard: Guard, form: Form) -> bool:
    """Whether a rewrite to `form` wraps the site in the red-zone guard (rewriter/plan.py asks
    this too): always or never as `guard` says; with auto, where the form's generation writes
    below %rsp on a hit (nop5's call and pushes; nop10's lea moves %rsp first) and the
    site's function may keep live data there."""
    if guard is not Guard.AUTO:
        return guard is Guard.ALWAYS
    if not form.kernel.red_zone_hazard:
        return False
    return sc.red_zone is None or sc.red_zone.may_use


def _stubs_outside(w: PatchWindow) -> list[int]:
    """The `jmp rel32` stubs a window's rewrite writes outside it: its 8-bit ways in's and a
    short window's entry stub (one in the window's own filler is part of the window)."""
    return [a for a in (w.entry_stub, *(r.stub for r in w.retargets))
            if a is not None and not w.start <= a < w.end]


def _window_refused(ctx: CodeContext, sc: SiteCheck, w: PatchWindow,
                    members: list[SiteCheck], claimed: Claims,
                    options: CheckOptions, shstk: list[bool]) -> tuple[str, str] | None:
    """(code, reason) when rewrite does not use the site's window, else None."""
    if claimed.overlaps(w.start, w.end):
        return WINDOW_OVERLAPS_SITE.code, (f"its window overlaps another rewritten site's "
                                           f"([{w.start:#x}, {w.end:#x}))")
    for a in _stubs_outside(w):  # the plan's _retarget_patches and _entry_stub say the same
        if claimed.overlaps(a, a + STUB_SIZE):
            return WINDOW_WAY_IN.code, (f"the stub at {a:#x} lies in another rewritten site's "
                                        f"window")
    guarded = any(needs_red_zone_guard(m, options.guard, options.form) for m in members)
    for m in members:
        if guarded:
            _args, why = guard_args(m.probe.args)
            if why is not None:
                return GUARD_IMPOSSIBLE.code, f"{m.probe.probe_id}: {why}"
        numeric = uses_numeric_rip(m.probe.args)
        if numeric is not None and w.shape not in (WindowShape.IN_PLACE, WindowShape.RELAID):
            return ARG_RIP_RELATIVE.code, (f"{m.probe.probe_id}: argument {numeric!r} is read "
                                           f"relative to rip and would move")
    if w.calls or w.shape is not WindowShape.IN_PLACE:
        if not shstk:
            shstk.append(shadow_stack_marked(ctx.image))
        how = detour_handling(ctx.image, ctx.cfi, w, options.calls, shstk[0])
        if isinstance(how, Refusal):
            return how.code, how.reason
    return window_debug_refusal(ctx.image, w.start, w.end)


def _moved_calls(ctx: CodeContext, sc: SiteCheck, w: PatchWindow, options: CheckOptions,
                 shstk: list[bool]) -> list[Finding]:
    """`moved-call-return-address` for each call the rewrite moves into the detour (its
    callee sees a return address there; analysis/calls.py decides, as for the rewrite)."""
    if not w.calls or w.shape is WindowShape.IN_PLACE:
        return []
    if not shstk:
        shstk.append(shadow_stack_marked(ctx.image))
    how = detour_handling(ctx.image, ctx.cfi, w, options.calls, shstk[0])
    if isinstance(how, Refusal) or how.technique != MOVED:
        return []
    return [MOVED_CALL_RETURN_ADDRESS.finding(
        f"the call at {c:#x} moves into the detour: its callee will see "
        f"a return address in the detour, not {r:#x}", sc.probe.probe_id)
        for c, r, _seen in return_addresses(w, MOVED)]


def used_window(w: PatchWindow, probe: Probe, members: list[Probe], form: Form,
                guarded: bool) -> PatchWindow:
    """The window as rewrite uses it: an IN_PLACE window stays in place only where the new
    site is written over the NOP run itself (one site, no red-zone guard, the probe at the
    window's start, the new bytes fitting and optimized where they land); otherwise the NOP
    run moves to a detour, and the window is a FORWARD one (relocated bytes, two jumps). The
    one decision check's outcome, its per-site text, its JSON and rewrite's plan all read
    (rewriter/plan.py asks it too): the rules for a moving window (an argument read relative
    to rip by number) then apply to it."""
    if w.shape is not WindowShape.IN_PLACE:
        return w
    sb = site_bytes(form, guarded)
    pc = probe.address
    if (len(members) == 1 and not guarded and pc == w.start and len(sb.code) <= w.end - pc
            and optimized_where_it_is(sb.code[sb.optimized_offset:], pc + sb.optimized_offset,
                                      form.kernel)):
        return w
    why = ("the red-zone guard needs a detour" if guarded else
           f"{len(members)} sites share the NOP run" if len(members) > 1 else
           "the new site is not optimized there")
    return replace(w, shape=WindowShape.FORWARD, replacement=None,
                   relocated_bytes=len(w.code), extra_jumps=2,
                   end_reason=f"{w.end_reason}; the NOP run moves to a detour: {why}")


def _used(sc: SiteCheck, outcome: str, w: PatchWindow) -> SiteCheck:
    """`sc` with the outcome and the window rewrite uses: the window decided for the site
    that leads it (a site moved along with another's window shows that window, as rewrite's
    report does), so that every rendering of the site says the same."""
    if sc.window is None or sc.window.window is None or sc.window.window == w:
        return sc if sc.outcome == outcome else replace(sc, outcome=outcome, blocked=None)
    return replace(sc, outcome=outcome, blocked=None, window=replace(sc.window, window=w))


def _code_fork_findings(ctx: CodeContext, sites: tuple[SiteCheck, ...]) -> list[Finding]:
    """Where no symbol names a fork that copies the address space: what the code says
    (usdtpatch.analysis.hazards.fork_evidence): `process-can-fork` for a fork or clone system
    call, `fork-unknown` when it cannot tell; never silence for a file that may fork."""

    exposed = [s for s in sites if s.outcome not in (NOT_APPLICABLE, BLOCKED)]
    image = ctx.image
    if not exposed or coverage(image) is not None or is_shared(image):
        return []
    ev = fork_evidence(ctx)
    why = ev.describe() or ev.uncertainty()
    if why is None:
        return []
    now = sum(1 for s in sites if s.outcome == OPTIMIZABLE)
    counts = (f"{now} site(s) optimizable as they are, {len(exposed) - now} after rewrite")
    out: list[Finding] = []
    if ev.forks:
        out.append(PROCESS_CAN_FORK.finding(
            f"no symbol names a fork, but {why}: a child forked while a site is optimized "
            f"inherits the call to the trampoline but not its page and dies with SIGSEGV at "
            f"the site ({counts})", severity=Severity.ERROR if now else Severity.WARNING))
    else:
        out.append(FORK_UNKNOWN.finding(
            f"no symbol names a fork and the code cannot tell whether the process forks "
            f"({why}); if it does, a child forked while a site is optimized dies with "
            f"SIGSEGV at the site ({counts})"))
    return out


def _library_syscall_findings(ctx: CodeContext, sites: tuple[SiteCheck, ...]
                              ) -> list[Finding]:
    """`fork-unknown` for a shared object that calls `syscall()` with a fork number or one not
    fixed in its code (Ruby's Kernel#syscall): the fork guard's atfork handler does not run
    for such a fork. Reported of the input: the rewrite's guard covers fork() and interposes the
    object's GOT slot of syscall() (docs/fork-guard.md, "Every route to a child")."""
    image = ctx.image
    if not is_shared(image) or coverage(image) is not None or \
            not any(s.outcome not in (NOT_APPLICABLE, BLOCKED) for s in sites):
        return []
    ev = fork_evidence(ctx, raw=False)
    items = [*ev.forks, *ev.unknown]
    if not items:
        return []
    at, what = items[0]
    more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
    return [FORK_UNKNOWN.finding(
        f"the library may fork through syscall(): {what}{f' at {at:#x}' if at else ''}{more}; "
        f"the fork guard's atfork handler does not run for such a fork, and its child dies "
        f"with SIGSEGV at an optimized site (usdtpatch rewrite's guard covers fork() and "
        f"interposes the library's GOT slot of syscall(); a syscall instruction of the "
        f"library's own code is not covered)")]


def model_refusal(ctx: CodeContext, address: int, bounds: FunctionBounds | None
                  ) -> Finding | None:
    """Why the site at `address` gets no window because the file uses a construct outside
    the model (usdtpatch.analysis.closed: file-wide, or local to the function `bounds`), or
    None. rewriter/plan.py follows it for every site, a moved nop5 too."""
    got = file_refusal(ctx.image)
    if got is None and bounds is not None:
        got = local_refusal(ctx.image, ctx.cfi, address)
    return got


def _check_site(ctx: CodeContext, probe: Probe, rseq: tuple[RseqCs, ...],
                stacks: StackMemo | None = None) -> SiteCheck:
    image = ctx.image
    where = probe.probe_id
    cand = site_candidacy(probe, image)
    v = cand.verdict(DEFAULT)
    findings: list[Finding] = []
    findings.extend(semaphore_problems(probe, image, where))
    if v.code in _KERNEL_FINDINGS:
        findings.append(lookup(v.code).finding(v.reason, where))
    if v.outcome is Outcome.NOT_APPLICABLE:
        return SiteCheck(probe=probe, candidacy=cand, outcome=NOT_APPLICABLE, blocked=None,
                         window=None, red_zone=None, function=None, findings=tuple(findings))
    bounds = ctx.bounds(probe.address)
    fc: FunctionCode | None = ctx.function(bounds) if bounds is not None else None
    rz = red_zone(fc, probe, stacks)
    outcome = OPTIMIZABLE if v.outcome.optimized else BLOCKED
    cs = next((r for r in rseq if r.start <= probe.address < r.end), None)
    if cs is not None and outcome == OPTIMIZABLE:
        findings.append(SITE_IN_RSEQ_CS.finding(
            f"the optimized site is inside the rseq critical section [{cs.start:#x}, "
            f"{cs.end:#x}): every hit makes the uprobe syscall there (a kernel built with "
            "CONFIG_DEBUG_RSEQ kills a task that makes a syscall in a critical section)", where))
    blocked: str | None = None
    window: WindowResult | None = None
    if outcome != OPTIMIZABLE:
        refusal = model_refusal(ctx, probe.address, bounds)
        if v.code in (SITE_ELF32.code, NO_TRAMPOLINE_REACH.code):
            blocked = v.code
        elif refusal is not None:  # a construct outside the model: no window (closed.py)
            blocked = refusal.code
            window = WindowResult(None, refusal.code, refusal.message, ())
            findings.append(replace(refusal, where=where))
        elif fc is None or bounds is None:
            blocked = WINDOW_NO_FUNCTION_BOUNDS.code
            findings.append(WINDOW_NO_FUNCTION_BOUNDS.finding(
                f"no FDE and no symbol covers {probe.address:#x}: the function's branch targets "
                "are unknown", where))
        elif cs is not None:
            blocked = SITE_IN_RSEQ_CS.code
            findings.append(SITE_IN_RSEQ_CS.finding(
                f"the site is inside the rseq critical section [{cs.start:#x}, {cs.end:#x}): "
                "its code must not move", where))
        else:
            code = image.read_vaddr(bounds.start, bounds.size + fc.padding_after)
            window = find_window(fc, probe.address, code, _pinned(ctx, bounds.start),
                                 same_row(ctx))
            if window.window is not None:
                outcome = window.window.shape.value
            else:
                blocked = window.code or WINDOW_BRANCH_TARGET.code
                findings.append(lookup(blocked).finding(f"no patch window: {window.reason}",
                                                        where))
        if blocked is not None:
            outcome = BLOCKED
    # Hazards that depend on the outcome.
    if rz.may_use and outcome == OPTIMIZABLE:
        findings.append(RED_ZONE_LIVE.finding(
            f"the site is optimized on {DEFAULT.name} and its function may keep live data "
            f"below %rsp: "
            f"{rz.reason}; every optimized hit overwrites the {CLOBBERED} bytes below %rsp",
            where))
    elif rz.may_use and outcome in (IN_PLACE, FORWARD, BACKWARD):
        findings.append(RED_ZONE_REWRITE.finding(
            f"the function may keep live data below %rsp: {rz.reason}", where))
    moved = outcome in (FORWARD, BACKWARD)
    for a in probe.args:
        op = a.operand
        if not isinstance(op, MemOperand):
            continue
        if op.base == "rip" and moved:
            findings.append(ARG_USES_RIP.finding(
                f"argument {a.raw} is rip-relative by symbol and the site moves to a detour, "
                f"where %rip differs", where))
        if op.base == "rsp" and rz.may_use and outcome in (IN_PLACE, FORWARD, BACKWARD):
            findings.append(ARG_USES_RSP.finding(
                f"argument {a.raw} is addressed through %rsp: the red-zone-safe detour lowers "
                "%rsp by 128 around the probe", where))
    return SiteCheck(probe=probe, candidacy=cand, outcome=outcome, blocked=blocked, window=window,
                     red_zone=rz, function=bounds, findings=tuple(findings))
