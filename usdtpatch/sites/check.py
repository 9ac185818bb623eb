"""`check`: every probe site of one file judged as an optimization candidate (one pure function).

check(probeset) -> CheckReport ties together the kernel's verdict matrix (candidacy), function
bounds and branch targets (functions, targets), patch windows (windows) and hazards. Each
function holding a probe is disassembled once, whatever the number of its probes.
The finding codes are documented in docs/findings.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

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
    Finding,
    Severity,
    lookup,
)
from usdtpatch.sites.candidacy import Candidacy, Outcome, site_candidacy
from usdtpatch.sites.functions import FunctionBounds
from usdtpatch.sites.hazards import (
    CLOBBERED,
    FORK_COPIES_MM,
    RedZone,
    RseqCs,
    StackMemo,
    imported_fork_family,
    red_zone,
    rseq_sections,
    semaphore_problems,
)
from usdtpatch.sites.probes import Probe, ProbeSet
from usdtpatch.sites.targets import CodeContext, FunctionCode
from usdtpatch.sites.windows import WindowResult, WindowShape, find_window
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
    rseq = rseq_sections(ctx) if probeset.probes else ()
    ctx.rseq_aborts = tuple(r.abort for r in rseq)
    forks = imported_fork_family(image) if probeset.probes else ()
    stacks = StackMemo()
    sites = tuple(_check_site(ctx, p, rseq, stacks) for p in probeset.probes)
    findings.extend(_fork_findings(image, sites, forks))
    return CheckReport(probeset, sites, tuple(findings), forks, cfi.source, len(cfi), ctx)


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
