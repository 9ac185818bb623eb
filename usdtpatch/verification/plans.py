"""Verification of a plan's write sequences: protocol rules, then torn-state execution.

For every sequence of a site and every consecutive pair of its states, every torn mixture of
the bytes that differ (each changed byte taken from either state: what a CPU fetching the site
while the kernel writes may see) is executed by a thread arriving at the site, in the
emulator (usdtpatch.verification.machine). It must end at the site's exit with every register and
flag as on arrival (rip aside), rsp unchanged, at most one hit whose registers are the ones
the thread had at the site, no fault, and no write at or above rsp. The last transition of
unoptimize and detach is also run with the uprobe gone before the thread's int3 is handled
(the kernel then restarts the instruction). A thread parked at each instruction of the
trampoline while each state of the unoptimize sequence is written must still return
correctly. Writes below rsp are recorded: on the 6.18 nop5 path they are the
`optimized-call-clobbers-red-zone` hazard; a guarded site must leave [rsp-128, rsp) alone.

The protocol rules are the kernel's (docs/plan-verify.md, "Verification"): int3 first, no byte other
than byte 0 written unless byte 0 is int3, the opcode last, byte 0 always written alone,
rel32 = trampoline - call end, no page crossing, unoptimize ends on the NOP.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import product

from usdtpatch.analysis.probes import read_probes
from usdtpatch.analysis.rules import rule
from usdtpatch.elf.image import ET_EXEC, ElfImage
from usdtpatch.findings import (
    ADDRESS_MISMATCH,
    DETACH_END_NOT_ORIGINAL,
    DISPLACEMENT_WITHOUT_INT3,
    GUARDED_SITE_WRITES_RED_ZONE,
    HIT_REPORTS_WRONG_REGISTERS,
    KERNEL_CHECK_FAILS,
    MACHINE_ERROR,
    NO_INT3_FIRST,
    OPCODE_BEFORE_DISPLACEMENT,
    OPTIMIZE_END_NOT_CALL,
    OPTIMIZED_CALL_CLOBBERS_RED_ZONE,
    ORIGINAL_MISMATCH,
    PARKED_THREAD_FAILS,
    PLAN_FILE_MISMATCH,
    SEQUENCE_START_MISMATCH,
    SITE_CROSSES_PAGE,
    SITE_UNMAPPED,
    STEP_INCONSISTENT,
    TOO_MANY_TORN_BYTES,
    TORN_STATE_CLOBBERS_REGISTERS,
    TORN_STATE_DOUBLE_HIT,
    TORN_STATE_FAULTS,
    TORN_STATE_GOES_ASTRAY,
    TORN_STATE_MISSES_HIT,
    TORN_STATE_MOVES_RSP,
    TORN_STATE_WRITES_MEMORY,
    TRAMPOLINE_OVERLAPS_FILE,
    UNOPTIMIZE_END_NOT_NOP,
    UNOPTIMIZE_LEAVES_CALL,
    WRITE_OUTSIDE_SITE,
    WRITE_SPANS_BYTE0,
    WRONG_REL32,
    Finding,
    Severity,
    lookup,
)
from usdtpatch.kernelfacts import DEFAULT, PAGE, RED_ZONE, Generation
from usdtpatch.sequences.plan import Plan, SitePlan, check_plan_matches, red_zone_users
from usdtpatch.sequences.sequences import (
    CALL_REL32,
    INT3,
    PROTOCOL_INT3,
    Sequence,
    SiteSequences,
    apply_write,
    call_target,
    protocol_generation,
)
from usdtpatch.verification.machine import (
    KernelState,
    Machine,
    MachineError,
    RunResult,
    load_segments,
)
from usdtpatch.x86.nops import decode_nop

MAX_TORN_BYTES = 12  # 4096 mixtures per transition at most
TRAMPOLINE_INSNS = 9  # push, push, push, mov, syscall, pop, pop, pop, ret

PASS = "pass"
FAIL = "fail"
SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Failure:
    code: str  # a registered code (usdtpatch.findings), checked when made
    message: str

    def __post_init__(self) -> None:
        lookup(self.code)

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class SiteVerdict:
    probe: str
    address: int
    protocol: str
    status: str  # pass | fail | skip
    failures: tuple[Failure, ...]
    hazards: tuple[Finding, ...]
    runs: int
    red_zone_writes: tuple[int, ...]  # offsets from rsp written below it on the optimized path
    reason: str = ""  # why a site was skipped

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(f.code for f in self.failures)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    path: str
    protocol: str
    verdicts: tuple[SiteVerdict, ...]
    findings: tuple[Finding, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(v.status != FAIL for v in self.verdicts) and not any(
            f.severity == Severity.ERROR for f in self.findings)

    @property
    def runs(self) -> int:
        return sum(v.runs for v in self.verdicts)


@dataclass
class _Ctx:
    machine: Machine
    site: SitePlan
    seqs: SiteSequences
    kernel_length: int
    call_length: int
    extra_sp: int
    failures: list[Failure] = field(default_factory=list)
    seen_codes: set[str] = field(default_factory=set)
    cache: dict[tuple[bytes, KernelState], RunResult] = field(default_factory=dict)
    runs: int = 0
    red_zone: set[int] = field(default_factory=set)

    def fail(self, code: str, message: str) -> None:
        if code in self.seen_codes:
            return  # one message per code per site keeps the report readable
        self.seen_codes.add(code)
        self.failures.append(Failure(code, message))


def _hx(b: bytes) -> str:
    return b.hex(" ")


def _gen(seqs: SiteSequences) -> Generation:
    """The generation whose sequences these are (an int3-only site: the default's)."""
    return seqs.generation or DEFAULT


def _call_form(seqs: SiteSequences, state: bytes) -> int | None:
    """The call target of an optimized state, None when it is not the call form."""
    gen = _gen(seqs)
    at = gen.call_offset
    if state[:at] == gen.optimized_head and len(state) >= at + 5 and state[at] == CALL_REL32:
        return call_target(seqs.address, gen.nop_length, state[at + 1:at + 5])
    return None


def _opcode(seqs: SiteSequences) -> int:
    """The byte an optimize sequence writes last at byte 0 (e8, or the lea's REX.W 48)."""
    return _gen(seqs).optimized(0)[0]


def _check_rules(ctx: _Ctx, file_bytes: bytes) -> None:
    """The protocol rules, without running anything."""
    seqs, site = ctx.seqs, ctx.site
    n = len(seqs.original)
    if file_bytes[:n] != seqs.original:
        ctx.fail(ORIGINAL_MISMATCH.code, f"the plan's original bytes {_hx(seqs.original)} are not "
                                      f"the file's {_hx(file_bytes[:n])}")
    # Each sequence must start where the kernel leaves the site before it runs: a sequence
    # checked from any other state proves nothing about the bytes it will really write over.
    chain: list[tuple[Sequence | None, bytes, str]] = [
        (seqs.attach, seqs.original, "the original bytes"),
        (seqs.detach, seqs.attach.end, "attach's end state"),
        (seqs.optimize, seqs.original, "the original bytes"),
        (seqs.unoptimize, seqs.optimize.end if seqs.optimize else b"", "optimize's end state"),
    ]
    for seq, want_start, what in chain:
        if seq is None:
            continue
        if seq.start != want_start:
            ctx.fail(SEQUENCE_START_MISMATCH.code,
                     f"{seq.name} starts from {_hx(seq.start)}, expected {what} "
                     f"{_hx(want_start)}")
        if seq.address != seqs.address:
            ctx.fail(ADDRESS_MISMATCH.code, f"{seq.name} writes at {seq.address:#x}, the site is "
                                         f"at {seqs.address:#x}")
        state = seq.start
        final = seq.steps[-1].after if seq.steps else seq.start
        for i, st in enumerate(seq.steps):
            where = f"{seq.name} step {i + 1}"
            if st.before != state:
                ctx.fail(STEP_INCONSISTENT.code, f"{where}: 'before' is {_hx(st.before)}, the site "
                                              f"holds {_hx(state)}")
            try:
                after = apply_write(state, st.offset, st.data)
            except ValueError as exc:
                ctx.fail(WRITE_OUTSIDE_SITE.code, f"{where}: {exc}")
                return
            if st.after != after:
                ctx.fail(STEP_INCONSISTENT.code, f"{where}: 'after' is {_hx(st.after)}, the write "
                                              f"gives {_hx(after)}")
            if st.expect_byte0 is not None and state[0] != st.expect_byte0:
                ctx.fail(KERNEL_CHECK_FAILS.code,
                         f"{where}: the kernel expects byte 0 = {st.expect_byte0:02x} before "
                         f"writing, the site holds {state[0]:02x}")
            # The int3-first protocol: another thread may fetch the site between any two
            # writes, so a write that starts a change puts int3 at byte 0 first, bytes after
            # it change only while int3 stands there (the fetch traps instead of decoding a
            # mixture), and no single write spans byte 0 and the rest (not atomic for fetch).
            changed = [j for j in range(n) if after[j] != state[j]]
            if i == 0 and changed and (0 not in changed or after[0] != INT3) and \
                    seq.name in ("attach", "optimize", "unoptimize"):
                ctx.fail(NO_INT3_FIRST.code,
                         f"{where}: the first write changes {_hx(state)} -> {_hx(after)} "
                         f"instead of putting int3 at byte 0")
            if any(j > 0 for j in changed) and state[0] != INT3:
                ctx.fail(DISPLACEMENT_WITHOUT_INT3.code,
                         f"{where}: bytes {', '.join(str(j) for j in changed if j)} change "
                         f"while byte 0 is {state[0]:02x}, not int3")
            if st.offset == 0 and len(st.data) > 1 and any(j > 0 for j in changed) \
                    and 0 in changed:
                ctx.fail(WRITE_SPANS_BYTE0.code,
                         f"{where}: one {len(st.data)}-byte write changes byte 0 and bytes "
                         f"after it; a concurrent fetch can see any mixture")
            # the call's opcode goes in last: before it, the rel32 after it must be complete
            if seq.name == "optimize" and 0 in changed and after[0] == _opcode(seqs) and \
                    after[1:] != final[1:]:
                ctx.fail(OPCODE_BEFORE_DISPLACEMENT.code,
                         f"{where}: opcode {after[0]:02x} written while bytes 1..{n - 1} are "
                         f"{_hx(after[1:])}, not yet {_hx(final[1:])}")
            state = after
    if seqs.optimize is not None and seqs.unoptimize is not None:
        # the rule engine check asks: would the kernel optimize this site at all? (64-bit
        # only reaches here; the trampoline's reach is checked below, as wrong-rel32)
        v = rule(_gen(seqs), seqs.original, site.address)
        if v.code == SITE_CROSSES_PAGE.code:
            ctx.fail(SITE_CROSSES_PAGE.code,
                     f"the {n}-byte site at {site.address:#x} crosses a page boundary: the "
                     f"kernel never optimizes it")
        elif not v.outcome.optimized and v.code is not None:
            ctx.fail(v.code, f"the plan optimizes a site the kernel does not: {v.reason}")
        target = _call_form(seqs, seqs.optimize.end)
        if target is None:
            ctx.fail(OPTIMIZE_END_NOT_CALL.code, f"optimize ends on {_hx(seqs.optimize.end)}, "
                                              f"not a call to the trampoline")
        elif target != seqs.trampoline:
            tr = "none" if seqs.trampoline is None else f"{seqs.trampoline:#x}"
            ctx.fail(WRONG_REL32.code, f"the optimized call goes to {target:#x}, the trampoline "
                                    f"is {tr}")
        end = seqs.unoptimize.end
        if _call_form(seqs, end) is not None or end[0] == _opcode(seqs):
            ctx.fail(UNOPTIMIZE_LEAVES_CALL.code, f"unoptimize ends on {_hx(end)}: the call is "
                                               f"still there")
        elif _gen(seqs).restored + 1 < n:  # bytes after the restored ones keep the call's
            kept = _gen(seqs).restored + 1
            if end[:kept] != seqs.original[:kept]:
                ctx.fail(UNOPTIMIZE_END_NOT_NOP.code, f"unoptimize ends on {_hx(end)}, not the "
                                                   f"{n}-byte NOP")
        elif end != seqs.original:
            ctx.fail(UNOPTIMIZE_END_NOT_NOP.code, f"unoptimize ends on {_hx(end)}, not the "
                                               f"original {_hx(seqs.original)}")
    if seqs.detach.end != seqs.original:
        ctx.fail(DETACH_END_NOT_ORIGINAL.code, f"detach ends on {_hx(seqs.detach.end)}, not "
                                            f"{_hx(seqs.original)}")


def _span(offsets: list[int] | tuple[int, ...]) -> str:
    """[rsp-32, rsp) for offsets -32..-1 relative to rsp."""
    def at(v: int) -> str:
        return "rsp" if v == 0 else f"rsp{v:+d}"
    return f"[{at(min(offsets))}, {at(max(offsets) + 1)})"


def _mixtures(a: bytes, b: bytes) -> list[bytes]:
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    out = []
    for choice in product((False, True), repeat=len(diff)):
        m = bytearray(a)
        for pos, take_b in zip(diff, choice, strict=True):
            if take_b:
                m[pos] = b[pos]
        out.append(bytes(m))
    return out


def _expected_at_site(ctx: _Ctx) -> dict[str, int]:
    regs = dict(ctx.machine.arrival)
    regs["rip"] = ctx.seqs.address
    if ctx.site.guarded:
        regs["rsp"] -= RED_ZONE
    return regs


def _judge(ctx: _Ctx, res: RunResult, label: str) -> bool:
    """Check one run against 'as if no probe existed'; record failures; True when clean."""
    ok = True
    exit_ = ctx.site.exit
    if res.fault is not None:
        ctx.fail(TORN_STATE_FAULTS.code, f"{label}: {res.fault}")
        return False
    if res.end_rip != exit_:
        ctx.fail(TORN_STATE_GOES_ASTRAY.code,
                 f"{label}: the thread did not reach {exit_:#x} (stopped at {res.end_rip:#x}"
                 f"{'' if res.instructions_left else ', instruction budget spent'})")
        return False
    arrival = ctx.machine.arrival
    if res.regs["rsp"] != arrival["rsp"]:
        ctx.fail(TORN_STATE_MOVES_RSP.code, f"{label}: rsp {res.regs['rsp']:#x}, arrived with "
                                         f"{arrival['rsp']:#x}")
        ok = False
    bad = [n for n, v in res.regs.items() if n not in ("rip", "rsp") and arrival[n] != v]
    if bad:
        ctx.fail(TORN_STATE_CLOBBERS_REGISTERS.code, f"{label}: {', '.join(bad)} changed")
        ok = False
    if len(res.hits) > 1:
        ctx.fail(TORN_STATE_DOUBLE_HIT.code, f"{label}: {len(res.hits)} hits "
                                          f"({', '.join(h.via for h in res.hits)})")
        ok = False
    want = _expected_at_site(ctx)
    for h in res.hits:
        wrong = [n for n in want if h.regs.get(n) != want[n]]
        if wrong:
            ctx.fail(HIT_REPORTS_WRONG_REGISTERS.code,
                     f"{label}: the {h.via} hit reports {', '.join(wrong)} unlike the thread "
                     f"at the site (" + ", ".join(f"{n}={h.regs[n]:#x}" for n in wrong[:3]) +
                     ")")
            ok = False
    if res.other_writes or any(w >= 0 for w in res.stack_writes):
        ctx.fail(TORN_STATE_WRITES_MEMORY.code, f"{label}: writes at or above rsp or outside the "
                                             f"stack")
        ok = False
    below = [w for w in res.stack_writes if -RED_ZONE <= w < 0]
    if below:
        if ctx.site.guarded or not _gen(ctx.seqs).red_zone_hazard:
            ctx.fail(GUARDED_SITE_WRITES_RED_ZONE.code,
                     f"{label}: writes {_span(below)} inside the red zone of a guarded site")
            ok = False
        else:
            ctx.red_zone.update(below)
    return ok


def _run(ctx: _Ctx, state: bytes, kernel: KernelState, label: str) -> bool:
    key = (state, kernel)
    res = ctx.cache.get(key)
    if res is None:
        res = ctx.machine.run(ctx.site.entry, ctx.site.exit, ctx.seqs.address, state, kernel)
        ctx.runs += 1
        ctx.cache[key] = res
    ok = _judge(ctx, res, label)
    # A thread that meets the int3 or the call while the uprobe exists must be reported.
    if ok and kernel.probe and state[0] in (INT3, _opcode(ctx.seqs)) and not res.hits:
        ctx.fail(TORN_STATE_MISSES_HIT.code, f"{label}: the thread passed the probe unreported")
        ok = False
    return ok


def _check_torn(ctx: _Ctx) -> None:
    live = KernelState(probe=True, nop_length=ctx.kernel_length, late=None,
                       call_length=ctx.call_length, extra_sp=ctx.extra_sp)
    for seq in ctx.seqs.all_sequences():
        states = seq.states
        for i in range(len(states) - 1):
            a, b = states[i], states[i + 1]
            if len(a) != ctx.kernel_length or len(b) != ctx.kernel_length:
                continue  # not the site's length: step-inconsistent or a start mismatch says so
            diff = sum(1 for x, y in zip(a, b, strict=False) if x != y)
            if diff > MAX_TORN_BYTES:
                ctx.fail(TOO_MANY_TORN_BYTES.code, f"{seq.name} step {i + 1} changes {diff} "
                                                f"bytes at once ({1 << diff} mixtures)")
                continue
            last = i == len(states) - 2 and seq.name in ("unoptimize", "detach")
            for m in _mixtures(a, b):
                label = (f"{seq.name} step {i + 1} ({_hx(a)} -> {_hx(b)}), torn state "
                         f"{_hx(m)}")
                _run(ctx, m, live, label)
                if last and m[0] == INT3:
                    gone = KernelState(probe=False, nop_length=ctx.kernel_length, late=states[-1],
                                       call_length=ctx.call_length, extra_sp=ctx.extra_sp)
                    _run(ctx, m, gone, label + " handled after the uprobe is gone")


def _check_parked(ctx: _Ctx) -> None:
    seqs = ctx.seqs
    if seqs.optimize is None or seqs.unoptimize is None:
        return
    if _call_form(seqs, seqs.optimize.end) != seqs.trampoline or seqs.trampoline is None:
        return  # wrong-rel32 already says it; a thread cannot park in a missing trampoline
    # the instructions run before the trampoline's first: the call, the optimized head's lea,
    # the red-zone guard's lea
    pre = 1 + (1 if _gen(seqs).call_offset else 0) + (1 if ctx.site.guarded else 0)
    states = seqs.unoptimize.states[1:]
    for k in range(TRAMPOLINE_INSNS):
        for j, st in enumerate(states):
            probe = j < len(states) - 1
            kernel = KernelState(probe=probe, nop_length=ctx.kernel_length, late=None,
                                 call_length=ctx.call_length, extra_sp=ctx.extra_sp)
            res = ctx.machine.run(ctx.site.entry, ctx.site.exit, seqs.address,
                                  seqs.optimize.end, KernelState(probe=True,
                                                                 nop_length=ctx.kernel_length,
                                                                 late=None,
                                                                 call_length=ctx.call_length,
                                                                 extra_sp=ctx.extra_sp),
                                  park=(pre + k, st, kernel))
            ctx.runs += 1
            label = (f"thread parked after trampoline instruction {k} while unoptimize "
                     f"writes {_hx(st)}")
            before = len(ctx.failures)
            _judge(ctx, res, label)
            if len(ctx.failures) > before and not ctx.failures[-1].code.startswith("parked"):
                f = ctx.failures.pop()
                ctx.seen_codes.discard(f.code)
                ctx.fail(PARKED_THREAD_FAILS.code, f"{f.message} [{f.code}]")


def verify_site(machine: Machine, site: SitePlan, image: ElfImage, load_base: int,
                mapped_trampolines: set[int]) -> SiteVerdict:
    """The verdict on one site of a plan."""
    seqs = site.sequences
    if seqs is None:
        reason = site.findings[0].message if site.findings else "the site cannot be probed"
        return SiteVerdict(probe=site.probe, address=site.address, protocol="-", status=SKIP,
                           failures=(), hazards=(), runs=0, red_zone_writes=(), reason=reason)
    proto = seqs.protocol
    if not image.is64:
        return SiteVerdict(probe=site.probe, address=site.address, protocol=proto, status=SKIP,
                           failures=(), hazards=(), runs=0, red_zone_writes=(),
                           reason="32-bit code: the emulator models 64-bit processes only")
    nop = decode_nop(seqs.original)
    if nop is None or nop.length != len(seqs.original):
        return SiteVerdict(
            probe=site.probe, address=site.address, protocol=proto, status=SKIP, failures=(),
            hazards=(), runs=0, red_zone_writes=(),
            reason=f"the probed instruction {_hx(seqs.original)} is not a NOP: the "
                   f"kernel single-steps it out of line, which is not modelled")
    link = site.address - (0 if image.type == ET_EXEC else load_base)
    file_bytes = image.read_vaddr(link, len(seqs.original))
    gen = _gen(seqs)
    ctx = _Ctx(machine=machine, site=site, seqs=seqs, kernel_length=len(seqs.original),
               call_length=gen.nop_length, extra_sp=gen.rsp_moved)
    if link != site.link_address:
        ctx.fail(ADDRESS_MISMATCH.code, f"run-time address {site.address:#x} minus the load base "
                                     f"is {link:#x}, the plan says {site.link_address:#x}")
    if not site.entry <= site.address < site.address + len(seqs.original) <= site.exit or \
            site.exit - site.entry > 64:
        ctx.fail(ADDRESS_MISMATCH.code, f"the site {site.address:#x}+{len(seqs.original)} is not "
                                     f"inside its entry..exit {site.entry:#x}..{site.exit:#x}")
        return _verdict(ctx, proto)
    if not all(machine.mapped(a) for a in (site.entry, site.address, site.exit - 1)):
        ctx.fail(SITE_UNMAPPED.code, f"{site.entry:#x}..{site.exit:#x} is not in the file's "
                                  f"loaded segments")
        return _verdict(ctx, proto)
    _check_rules(ctx, file_bytes)
    if seqs.trampoline is not None and proto != PROTOCOL_INT3 and \
            seqs.trampoline not in mapped_trampolines:
        ctx.fail(TRAMPOLINE_OVERLAPS_FILE.code, f"trampoline {seqs.trampoline:#x} overlaps the "
                                             f"file's mappings or is not page aligned")
    if ORIGINAL_MISMATCH.code in ctx.seen_codes or WRITE_OUTSIDE_SITE.code in ctx.seen_codes:
        return _verdict(ctx, proto)
    _check_torn(ctx)
    _check_parked(ctx)
    return _verdict(ctx, proto)


def _verdict(ctx: _Ctx, proto: str) -> SiteVerdict:
    hazards: list[Finding] = []
    rz = tuple(sorted(ctx.red_zone))
    if rz:
        hazards.append(OPTIMIZED_CALL_CLOBBERS_RED_ZONE.finding(
            f"on the optimized path the call and the trampoline's pushes write {len(rz)} bytes "
            f"{_span(rz)} below rsp on every hit", ctx.site.probe))
    status = FAIL if ctx.failures else PASS
    return SiteVerdict(probe=ctx.site.probe, address=ctx.site.address, protocol=proto,
                       status=status, failures=tuple(ctx.failures), hazards=tuple(hazards),
                       runs=ctx.runs, red_zone_writes=rz)


def trampoline_code(protocol: str) -> bytes:
    """The trampoline page's code of the generation `protocol` names."""
    return (protocol_generation(protocol) or DEFAULT).trampoline


def verify_plan(plan: Plan, image: ElfImage,
                red_zone: Mapping[int, str] | None = None) -> VerifyReport:
    """Verify every site of `plan` against the file `image` in one emulator. The measured
    writes below rsp of an unguarded site are a hazard only where `check`'s red-zone rule
    says the function may keep live data there (`red_zone`: sequences.plan.red_zone_users of the
    file, worked out here when not given): the same sites as check's red-zone-live."""
    t0 = time.perf_counter()
    findings: list[Finding] = []
    for problem in check_plan_matches(plan, image):
        findings.append(PLAN_FILE_MISMATCH.finding(problem))
    code = trampoline_code(plan.protocol)
    gen = protocol_generation(plan.protocol) or DEFAULT
    load_base = 0 if image.type == ET_EXEC else plan.load_base
    # Map every trampoline the plan names that the machine can hold; sites naming another
    # fail with trampoline-overlaps-file.
    mapped: dict[int, bytes] = {}
    probe_machine: Machine | None = None
    if image.is64:
        try:
            load_segments(image)  # a malformed segment: no load base helps
            try:
                probe_machine = Machine(image, load_base, {}, gen)
            except MachineError as exc:
                findings.append(MACHINE_ERROR.finding(
                    f"the load base puts the file outside user space: {exc}"))
        except MachineError as exc:
            findings.append(MACHINE_ERROR.finding(f"the file is malformed: {exc}"))
    for t in plan.trampolines:
        if probe_machine is None:
            break
        clash = t % PAGE != 0 or any(probe_machine.mapped(a) for a in
                                          range(t, t + PAGE, 512)) or \
            any(abs(t - u) < PAGE for u in mapped)
        if not clash:
            mapped[t] = code
    machine: Machine | None = None
    if probe_machine is not None:
        try:
            machine = Machine(image, load_base, mapped, gen)
        except MachineError as exc:
            findings.append(MACHINE_ERROR.finding(str(exc)))
    verdicts = []
    for site in plan.sites:
        if machine is None:
            why = ("32-bit process: never optimized, and the emulator models 64-bit processes "
                   "only" if not image.is64 else "no emulator for this file")
            verdicts.append(SiteVerdict(
                probe=site.probe, address=site.address,
                protocol=site.sequences.protocol if site.sequences else "-", status=SKIP,
                failures=(), hazards=(), runs=0, red_zone_writes=(), reason=why))
            continue
        v = verify_site(machine, site, image, load_base, set(mapped))
        if any(h.code == OPTIMIZED_CALL_CLOBBERS_RED_ZONE.code for h in v.hazards):
            if red_zone is None:
                red_zone = red_zone_users(read_probes(image))
            reason = red_zone.get(site.index)
            v = replace(v, hazards=tuple(
                h if h.code != OPTIMIZED_CALL_CLOBBERS_RED_ZONE.code else
                replace(h, message=f"{h.message}, and the function may keep live data "
                                   f"there: {reason}")
                for h in v.hazards
                if h.code != OPTIMIZED_CALL_CLOBBERS_RED_ZONE.code or reason is not None))
        verdicts.append(v)
    return VerifyReport(path=plan.path, protocol=plan.protocol, verdicts=tuple(verdicts),
                        findings=tuple(findings), seconds=time.perf_counter() - t0)
