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
from usdtpatch.elf.symbols import SymbolTable, load_symbols
from usdtpatch.report.findings import Finding, Severity
from usdtpatch.sites.candidacy import Candidacy, Outcome, site_candidacy
from usdtpatch.sites.functions import FunctionBounds
from usdtpatch.sites.hazards import (
    CLOBBERED,
    FORK_COPIES_MM,
    RedZone,
    RseqCs,
    imported_fork_family,
    red_zone,
    rseq_sections,
    semaphore_problems,
)
from usdtpatch.sites.probes import Probe, ProbeSet
from usdtpatch.sites.targets import CodeContext, FunctionCode
from usdtpatch.sites.windows import WindowResult, WindowShape, find_window

# Site outcomes, in the order the summary lists them.
OPTIMIZABLE = "optimizable"
IN_PLACE = WindowShape.IN_PLACE.value
FORWARD = WindowShape.FORWARD.value
BACKWARD = WindowShape.BACKWARD.value
BLOCKED = "blocked"
NOT_APPLICABLE = "n/a"
OUTCOMES = (OPTIMIZABLE, IN_PLACE, FORWARD, BACKWARD, BLOCKED, NOT_APPLICABLE)

_SEMAPHORE_SEVERITY = {
    "semaphore-unmapped": Severity.ERROR,
    "semaphore-not-writable": Severity.ERROR,
    "semaphore-misaligned": Severity.ERROR,
    "semaphore-not-in-probes": Severity.WARNING,
}
_BLOCK_HINT = ("the site stays on the int3 path; rebuild with a header that emits a 5-byte NOP "
               "(usdtpatch's sdt.h, or usdt.h)")
_KERNEL_FINDINGS: dict[str, tuple[Severity, str]] = {
    "site-crosses-page": (Severity.WARNING, "a rewrite can move the probe into a detour that "
                                            "does not cross a page"),
    "site-segment-prefix": (Severity.ERROR, "uprobes cannot be attached here at all; rewrite the "
                                            "site to the canonical nop5"),
    "site-hint-nop": (Severity.WARNING, "the kernel single-steps this NOP (about 15x slower than "
                                        "the int3 path); rewrite it to the canonical nop5"),
    "site-elf32": (Severity.INFO, "only 64-bit processes get optimized uprobes"),
    "no-trampoline-reach": (Severity.WARNING, "the file spans more than 2 GiB"),
    "site-combo5-pc1": (Severity.INFO, "only libbpf 1.7+ attaches at pc + 1; a note rewrite that "
                                       "moves pc onto the nop5 serves every tracer"),
}


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
        findings.append(Finding("cfi-malformed", Severity.WARNING,
                                f"call frame information unusable: {exc}",
                                "function bounds come from symbols only", ".eh_frame_hdr"))
        cfi = CfiIndex(image, (), (), "none")
    ctx = CodeContext(image, cfi, symbols)
    rseq = rseq_sections(ctx) if probeset.probes else ()
    ctx.rseq_aborts = tuple(r.abort for r in rseq)
    forks = imported_fork_family(image) if probeset.probes else ()
    sites = tuple(_check_site(ctx, p, rseq) for p in probeset.probes)
    exposed = [s for s in sites if s.outcome not in (NOT_APPLICABLE, BLOCKED)]
    if forks and exposed:
        now = sum(1 for s in sites if s.outcome == OPTIMIZABLE)
        copying = [f for f in forks if f in FORK_COPIES_MM]
        shared = "" if copying else (" (each of these runs the child in the parent's address "
                                     "space until exec: exposed only if the child reaches a "
                                     "site before exec)")
        findings.append(Finding(
            "process-can-fork", Severity.ERROR if now and copying else Severity.WARNING,
            f"the file uses {', '.join(forks)}{shared}: a child forked while a site is optimized "
            f"inherits the call to the trampoline but not its page and dies with SIGSEGV at the "
            f"site ({now} site(s) optimizable as they are, {len(exposed) - now} after rewrite)",
            "do not trace the optimized sites of a forking process on a 6.18 kernel, or keep "
            "those probes on the int3 path", ""))
    return CheckReport(probeset, sites, tuple(findings), forks, cfi.source, len(cfi))


def _check_site(ctx: CodeContext, probe: Probe, rseq: tuple[RseqCs, ...]) -> SiteCheck:
    image = ctx.image
    where = probe.probe_id
    cand = site_candidacy(probe, image)
    v = cand.kernel_618
    findings: list[Finding] = []
    for problem in semaphore_problems(probe, image):
        findings.append(Finding(problem.code, _SEMAPHORE_SEVERITY[problem.code], problem.message,
                                problem.hint, where))
    if v.code in _KERNEL_FINDINGS:
        sev, hint = _KERNEL_FINDINGS[v.code]
        findings.append(Finding(v.code, sev, v.reason, hint, where))
    if v.outcome is Outcome.NOT_APPLICABLE:
        return SiteCheck(probe, cand, NOT_APPLICABLE, None, None, None, None, tuple(findings))
    bounds = ctx.bounds(probe.address)
    fc: FunctionCode | None = ctx.function(bounds) if bounds is not None else None
    rz = red_zone(fc, probe)
    outcome = OPTIMIZABLE if v.outcome.optimized else BLOCKED
    cs = next((r for r in rseq if r.start <= probe.address < r.end), None)
    if cs is not None and outcome == OPTIMIZABLE:
        findings.append(Finding(
            "site-in-rseq-cs", Severity.WARNING,
            f"the optimized site is inside the rseq critical section [{cs.start:#x}, "
            f"{cs.end:#x}): every hit makes the uprobe syscall there (a kernel built with "
            "CONFIG_DEBUG_RSEQ kills a task that makes a syscall in a critical section)",
            "keep this probe untraced, or move it out of the critical section", where))
    blocked: str | None = None
    window: WindowResult | None = None
    if outcome != OPTIMIZABLE:
        if v.code in ("site-elf32", "no-trampoline-reach"):
            blocked = v.code
        elif fc is None or bounds is None:
            blocked = "window-no-function-bounds"
            findings.append(Finding(blocked, Severity.WARNING,
                                    f"no FDE and no symbol covers {probe.address:#x}: the "
                                    "function's branch targets are unknown", _BLOCK_HINT, where))
        elif cs is not None:
            blocked = "site-in-rseq-cs"
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
                blocked = window.code or "window-branch-target"
                findings.append(Finding(blocked, Severity.WARNING,
                                        f"no patch window: {window.reason}", _BLOCK_HINT,
                                        where))
        if blocked is not None:
            outcome = BLOCKED
    # Hazards that depend on the outcome.
    if rz.may_use and outcome == OPTIMIZABLE:
        findings.append(Finding(
            "red-zone-live", Severity.ERROR,
            f"the site is optimized on 6.18 and its function may keep live data below %rsp: "
            f"{rz.reason}; every optimized hit overwrites the {CLOBBERED} bytes below %rsp",
            "build this code with -mno-red-zone, or rewrite the site with usdtpatch's "
            "red-zone-safe detour", where))
    elif rz.may_use and outcome in (IN_PLACE, FORWARD, BACKWARD):
        findings.append(Finding(
            "red-zone-rewrite", Severity.WARNING,
            f"the function may keep live data below %rsp: {rz.reason}",
            "the rewrite must wrap the probe in lea -0x80(%rsp),%rsp / lea 0x80(%rsp),%rsp",
            where))
    moved = outcome in (FORWARD, BACKWARD)
    for a in probe.args:
        op = a.operand
        if not isinstance(op, MemOperand):
            continue
        if op.base == "rip" and moved:
            findings.append(Finding("arg-uses-rip", Severity.INFO,
                                    f"argument {a.raw} is rip-relative: in a detour %rip differs",
                                    "the rewrite must re-express it for the probe's new address",
                                    where))
        if op.base == "rsp" and rz.may_use and outcome in (IN_PLACE, FORWARD, BACKWARD):
            findings.append(Finding("arg-uses-rsp", Severity.INFO,
                                    f"argument {a.raw} is addressed through %rsp: the "
                                    "red-zone-safe detour lowers %rsp by 128 around the probe",
                                    "the rewrite must add 128 to its displacement", where))
    return SiteCheck(probe, cand, outcome, blocked, window, rz, bounds, tuple(findings))
