"""`check`: every probe site of one file judged as an optimization candidate (one pure function).

check(probeset) -> CheckReport ties together the kernel's verdict matrix (candidacy), function
bounds and branch targets (functions, targets), patch windows (windows) and hazards. Each
function holding a probe is disassembled once, whatever the number of its probes.
The finding codes are documented in docs/findings.md.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field, replace

from usdtpatch.analysis.calls import CALLS_AUTO, call_technique, shadow_stack_marked
from usdtpatch.analysis.candidacy import Candidacy, Outcome, site_candidacy
from usdtpatch.analysis.functions import FunctionBounds
from usdtpatch.analysis.hazards import (
    CLOBBERED,
    FORK_COPIES_MM,
    RedZone,
    RseqCs,
    StackMemo,
    fork_evidence,
    imported_fork_family,
    red_zone,
    rseq_sections,
    semaphore_problems,
)
from usdtpatch.analysis.probes import Probe, ProbeSet
from usdtpatch.analysis.targets import CodeContext, FunctionCode
from usdtpatch.analysis.waysin import WaysIn, build_ways_in
from usdtpatch.analysis.windows import WindowResult, WindowShape, find_window
from usdtpatch.elf.args import MemOperand
from usdtpatch.elf.cfi import CfiError, CfiIndex, load_cfi
from usdtpatch.elf.image import ElfImage
from usdtpatch.elf.symbols import SymbolTable, load_symbols
from usdtpatch.findings import (
    ARG_USES_RIP,
    ARG_USES_RSP,
    CFI_MALFORMED,
    FORK_GUARD_UNAVAILABLE,
    FORK_GUARDED,
    FORK_UNKNOWN,
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
    WINDOW_CALL_UNWIND,
    WINDOW_NO_FUNCTION_BOUNDS,
    WINDOW_OVERLAPS_SITE,
    Finding,
    Severity,
    lookup,
)
from usdtpatch.rewriter.index import Claims  # the planner's claim index (check decides as it does)
from usdtpatch.x86.nops import SiteForm

# Site outcomes, in the order the summary lists them.
OPTIMIZABLE = "optimizable"
IN_PLACE = WindowShape.IN_PLACE.value
FORWARD = WindowShape.FORWARD.value
BACKWARD = WindowShape.BACKWARD.value
BLOCKED = "blocked"
NOT_APPLICABLE = "n/a"
OUTCOMES = (OPTIMIZABLE, IN_PLACE, FORWARD, BACKWARD, BLOCKED, NOT_APPLICABLE)

_BLOCK_HINT = WINDOW_BRANCH_TARGET.hint
# The kernel verdicts check reports as findings (with the registry's severity and hint).
_KERNEL_FINDINGS = frozenset(c.code for c in (
    SITE_CROSSES_PAGE, SITE_SEGMENT_PREFIX, SITE_HINT_NOP, SITE_ELF32, NO_TRAMPOLINE_REACH,
    SITE_COMBO5_PC1))


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
    context: CodeContext | None = field(default=None, repr=False, compare=False)

    @property
    def all_findings(self) -> tuple[Finding, ...]:
        return self.findings + tuple(f for s in self.sites for f in s.findings)

    def outcome_counts(self) -> dict[str, int]:
        c = Counter(s.outcome for s in self.sites)
        return {o: c.get(o, 0) for o in OUTCOMES}

    def blocked_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(s.blocked for s in self.sites if s.blocked).items()))


def check(probeset: ProbeSet, symbols: SymbolTable | None = None) -> CheckReport:
    """Judge every probe site of `probeset`; pure: no I/O, findings instead of exceptions."""
    image = probeset.image
    findings: list[Finding] = list(probeset.findings)
    if symbols is None:
        symbols = probeset.symbols if probeset.symbols is not None else load_symbols(image)
    try:
        cfi = load_cfi(image)
    except CfiError as exc:
        findings.append(Finding(CFI_MALFORMED.code, Severity.WARNING,
                                f"call frame information unusable: {exc}",
                                "function bounds come from symbols only", ".eh_frame_hdr"))
        cfi = CfiIndex(image, (), (), "none")
    ctx = CodeContext(image, cfi, symbols)
    ctx.ways_in = _ways_in_index(ctx, probeset)
    rseq = rseq_sections(ctx) if probeset.probes else ()
    ctx.rseq_aborts = tuple(r.abort for r in rseq)
    forks = imported_fork_family(image) if probeset.probes else ()
    stacks = StackMemo()
    sites = _together(ctx, tuple(_check_site(ctx, p, rseq, stacks) for p in probeset.probes))
    findings.extend(_fork_findings(image, sites, forks))
    if not any(f in FORK_COPIES_MM for f in forks):
        findings.extend(_code_fork_findings(ctx, sites))
    return CheckReport(probeset, sites, tuple(findings), forks, cfi.source, len(cfi), ctx)


def _ways_in_index(ctx: CodeContext, probeset: ProbeSet) -> WaysIn:
    """The file-wide index of ways into the code around every probe (built once per file)."""
    sites: list[tuple[int, int, int]] = []
    for p in probeset.probes:
        b = ctx.bounds(p.address)
        sites.append((p.address, b.start, b.end) if b is not None else
                     (p.address, p.address, p.address))
    starts = sorted({*ctx.cfi.starts, *ctx.symbols.addresses})
    return build_ways_in(ctx.image, sites, starts)


def _fork_findings(image: ElfImage, sites: tuple[SiteCheck, ...],
                   forks: tuple[str, ...]) -> list[Finding]:
    """The fork hazard of the file: covered by a fork guard (usdtpatch.forkguard: built with
    sys/sdt.h's, or added by rewrite), or `process-can-fork`, and whether rewrite could add
    the guard (docs/fork-guard.md)."""
    from usdtpatch import forkguard

    out: list[Finding] = []
    exposed = [s for s in sites if s.outcome not in (NOT_APPLICABLE, BLOCKED)]
    if not exposed:
        return out
    optimized = {s.probe.address + (1 if s.probe.site.form is SiteForm.COMBO5 else 0)
                 for s in sites if s.outcome == OPTIMIZABLE}
    cov = forkguard.coverage(image)
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
        out.append(Finding(
            PROCESS_CAN_FORK.code, Severity.ERROR if now and copying else Severity.WARNING,
            f"the file uses {', '.join(forks)}{shared}: a child forked while a site is optimized "
            f"inherits the call to the trampoline but not its page and dies with SIGSEGV at the "
            f"site ({now} site(s) optimizable as they are, {len(exposed) - now} after rewrite)",
            PROCESS_CAN_FORK.hint, ""))
        if copying and len(exposed) > now and cov is None:
            problem = forkguard.hook_problem(image)
            if problem is not None:
                out.append(FORK_GUARD_UNAVAILABLE.finding(
                    f"the file can fork and {len(exposed) - now} site(s) would be "
                    f"rewritten, but the fork guard cannot be added: {problem}"))
    return out


def _together(ctx: CodeContext, sites: tuple[SiteCheck, ...]) -> tuple[SiteCheck, ...]:
    """The sites as rewrite (default options) decides them together, walking them in address
    order as usdtpatch.rewriter.plan does: the sites inside one window go along with the
    first (one detour; `in-place` only for a window that holds one site and needs no red-zone
    guard, else the window moves to a detour: `forward`); a window overlapping one already
    taken is not used (`window-overlaps-site`); a window whose calls can neither move nor be
    emulated (usdtpatch.analysis.calls, `--calls auto`) is not used (`window-call-unwind`)."""
    shstk: bool | None = None
    by_address = sorted(sites, key=lambda s: s.probe.address)
    addresses = [s.probe.address for s in by_address]
    decided: dict[int, SiteCheck] = {}
    claimed = Claims()  # overlap tests by bisection: a scan per site was quadratic
    for sc in by_address:
        if sc.probe.index in decided:
            continue
        w = sc.window.window if sc.window is not None else None
        if w is None or sc.outcome not in (IN_PLACE, FORWARD, BACKWARD):
            continue
        if claimed.overlaps(w.start, w.end):
            why = "its window overlaps another rewritten site's"
            decided[sc.probe.index] = replace(
                sc, outcome=BLOCKED, blocked=WINDOW_OVERLAPS_SITE.code,
                findings=(*sc.findings, WINDOW_OVERLAPS_SITE.finding(
                    f"{why} ([{w.start:#x}, {w.end:#x}))", sc.probe.probe_id)))
            continue
        if w.calls:
            shstk = shadow_stack_marked(ctx.image) if shstk is None else shstk
            how = call_technique(ctx.image, ctx.cfi, w, CALLS_AUTO, shstk)
            if isinstance(how, str):
                decided[sc.probe.index] = replace(
                    sc, outcome=BLOCKED, blocked=WINDOW_CALL_UNWIND.code,
                    findings=(*sc.findings, WINDOW_CALL_UNWIND.finding(how, sc.probe.probe_id)))
                continue
        members = by_address[bisect_left(addresses, w.start):bisect_left(addresses, w.end)]
        guarded = any(m.red_zone is None or m.red_zone.may_use for m in members)
        shape = w.shape.value
        if w.shape is WindowShape.IN_PLACE and (len(members) > 1 or guarded):
            shape = FORWARD  # the NOP run moves to a detour, with the guard or its neighbours
        for m in members:
            decided[m.probe.index] = replace(m, outcome=shape, blocked=None) \
                if m.outcome != shape else m
        claimed.append((w.start, w.end))
        claimed.extend((r.source, r.source + 1) for r in w.retargets)
    return tuple(decided.get(s.probe.index, s) for s in sites)


def _code_fork_findings(ctx: CodeContext, sites: tuple[SiteCheck, ...]) -> list[Finding]:
    """Where no symbol names a fork that copies the address space: what the code says
    (usdtpatch.analysis.hazards.fork_evidence): `process-can-fork` for a fork or clone system
    call, `fork-unknown` when it cannot tell; never silence for a file that may fork."""
    from usdtpatch import forkguard

    exposed = [s for s in sites if s.outcome not in (NOT_APPLICABLE, BLOCKED)]
    image = ctx.image
    if not exposed or forkguard.coverage(image) is not None or forkguard.is_shared(image):
        return []
    ev = fork_evidence(ctx)
    why = ev.describe() or ev.uncertainty()
    if why is None:
        return []
    now = sum(1 for s in sites if s.outcome == OPTIMIZABLE)
    counts = (f"{now} site(s) optimizable as they are, {len(exposed) - now} after rewrite")
    out: list[Finding] = []
    if ev.forks:
        out.append(Finding(
            PROCESS_CAN_FORK.code, Severity.ERROR if now else Severity.WARNING,
            f"no symbol names a fork, but {why}: a child forked while a site is optimized "
            f"inherits the call to the trampoline but not its page and dies with SIGSEGV at "
            f"the site ({counts})", PROCESS_CAN_FORK.hint, ""))
    else:
        out.append(FORK_UNKNOWN.finding(
            f"no symbol names a fork and the code cannot tell whether the process forks "
            f"({why}); if it does, a child forked while a site is optimized dies with "
            f"SIGSEGV at the site ({counts})"))
    if ev.forks and len(exposed) > now:
        problem = forkguard.hook_problem(image)
        if problem is not None:
            out.append(FORK_GUARD_UNAVAILABLE.finding(
                f"the file may fork and {len(exposed) - now} site(s) would be rewritten, but "
                f"the fork guard cannot be added: {problem}; rewrite --fork-guard auto "
                f"refuses the file (--fork-guard never accepts the risk)"))
    return out


def _check_site(ctx: CodeContext, probe: Probe, rseq: tuple[RseqCs, ...],
                stacks: StackMemo | None = None) -> SiteCheck:
    image = ctx.image
    where = probe.probe_id
    cand = site_candidacy(probe, image)
    v = cand.kernel_618
    findings: list[Finding] = []
    for problem in semaphore_problems(probe, image):
        findings.append(lookup(problem.code).finding(problem.message, where, problem.hint))
    if v.code in _KERNEL_FINDINGS:
        findings.append(lookup(v.code).finding(v.reason, where))
    if v.outcome is Outcome.NOT_APPLICABLE:
        return SiteCheck(probe, cand, NOT_APPLICABLE, None, None, None, None, tuple(findings))
    bounds = ctx.bounds(probe.address)
    fc: FunctionCode | None = ctx.function(bounds) if bounds is not None else None
    rz = red_zone(fc, probe, stacks)
    outcome = OPTIMIZABLE if v.outcome.optimized else BLOCKED
    cs = next((r for r in rseq if r.start <= probe.address < r.end), None)
    if cs is not None and outcome == OPTIMIZABLE:
        findings.append(Finding(
            SITE_IN_RSEQ_CS.code, Severity.WARNING,
            f"the optimized site is inside the rseq critical section [{cs.start:#x}, "
            f"{cs.end:#x}): every hit makes the uprobe syscall there (a kernel built with "
            "CONFIG_DEBUG_RSEQ kills a task that makes a syscall in a critical section)",
            "keep this probe untraced, or move it out of the critical section", where))
    blocked: str | None = None
    window: WindowResult | None = None
    if outcome != OPTIMIZABLE:
        if v.code in (SITE_ELF32.code, NO_TRAMPOLINE_REACH.code):
            blocked = v.code
        elif fc is None or bounds is None:
            blocked = WINDOW_NO_FUNCTION_BOUNDS.code
            findings.append(Finding(blocked, Severity.WARNING,
                                    f"no FDE and no symbol covers {probe.address:#x}: the "
                                    "function's branch targets are unknown", _BLOCK_HINT, where))
        elif cs is not None:
            blocked = SITE_IN_RSEQ_CS.code
            findings.append(Finding(blocked, Severity.WARNING,
                                    f"the site is inside the rseq critical section "
                                    f"[{cs.start:#x}, {cs.end:#x}): its code must not move",
                                    _BLOCK_HINT, where))
        else:
            code = image.read_vaddr(bounds.start, bounds.size + fc.padding_after)
            window = find_window(fc, probe.address, code)
            if window.window is not None:
                outcome = window.window.shape.value
            else:
                blocked = window.code or WINDOW_BRANCH_TARGET.code
                findings.append(Finding(blocked, Severity.WARNING,
                                        f"no patch window: {window.reason}", _BLOCK_HINT,
                                        where))
        if blocked is not None:
            outcome = BLOCKED
    # Hazards that depend on the outcome.
    if rz.may_use and outcome == OPTIMIZABLE:
        findings.append(Finding(
            RED_ZONE_LIVE.code, Severity.ERROR,
            f"the site is optimized on 6.18 and its function may keep live data below %rsp: "
            f"{rz.reason}; every optimized hit overwrites the {CLOBBERED} bytes below %rsp",
            RED_ZONE_LIVE.hint, where))
    elif rz.may_use and outcome in (IN_PLACE, FORWARD, BACKWARD):
        findings.append(Finding(
            RED_ZONE_REWRITE.code, Severity.WARNING,
            f"the function may keep live data below %rsp: {rz.reason}",
            "the rewrite must wrap the probe in lea -0x80(%rsp),%rsp / lea 0x80(%rsp),%rsp",
            where))
    moved = outcome in (FORWARD, BACKWARD)
    for a in probe.args:
        op = a.operand
        if not isinstance(op, MemOperand):
            continue
        if op.base == "rip" and moved:
            findings.append(Finding(ARG_USES_RIP.code, Severity.INFO,
                                    f"argument {a.raw} is rip-relative: in a detour %rip differs",
                                    "the rewrite must re-express it for the probe's new address",
                                    where))
        if op.base == "rsp" and rz.may_use and outcome in (IN_PLACE, FORWARD, BACKWARD):
            findings.append(Finding(ARG_USES_RSP.code, Severity.INFO,
                                    f"argument {a.raw} is addressed through %rsp: the "
                                    "red-zone-safe detour lowers %rsp by 128 around the probe",
                                    "the rewrite must add 128 to its displacement", where))
    return SiteCheck(probe, cand, outcome, blocked, window, rz, bounds, tuple(findings))
