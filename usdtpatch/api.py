"""The usdtpatch library: every command of the CLI as a function.

    import usdtpatch

    probes = usdtpatch.load("prog")                     # the probes of a file
    result = usdtpatch.check("prog")                    # findings per site and file
    out = usdtpatch.rewrite("prog", "prog.nop5")        # verified, atomic, keeps the mode
    if out.failed: ...                                  # a site could not be rewritten
    usdtpatch.restore("prog.nop5", "prog.orig")         # the original, byte for byte

Options are keyword-only; enums (`Form`, `Guard`, `ForkGuard`) or their string values are
accepted. A file that cannot be used raises a `UsdtpatchError` (InputError, ElfFormatError,
UnsupportedError, OutputError) whose message says what is wrong; a problem with one site is
a finding in the result, never an exception. Inputs are only read; an output is written
through a temporary file and one rename, and an output that is an input is refused unless
`in_place=True`.

The public face is `__all__`: the functions, the results and the errors, and what the
command line and the build integration take besides (the enums and choices of the options,
the finding registry, the checked output writes of usdtpatch.io, the plan's and protocol's
types). cli/ and integrate/ import nothing else of usdtpatch but report/ and their own
modules (tests/test_structure.py holds it). The names of deferred modules are bound on first
use (`__getattr__` below, `_LAZY`), so that `import usdtpatch.api` costs `list` no analysis
it does not do.

Deferred imports, inside the functions that use them, so that a command loads no engine and
no other command's machinery it does not use (docs/performance.md, "Deferred imports"):
- engines: rewriter/plan.py and rewriter/build.py (iced-x86, through x86/relocate.py), the
  verifiers (unicorn: verification/, its equivalence.py, plans.py and fork.py), the prover
  (z3 and pyvex: prove/), the output's validation (elf/validate.py: pyelftools, hashlib);
- the site analysis (analysis/check.py, analysis/calls.py, analysis/hazards.py and
  rewriter/marker.py, with the windows, targets and capstone's sweep they load): `list`
  imports this module and reads probes only;
- other commands' machinery, each of which `check` would otherwise load (together 23 ms of
  `check`'s 94 ms start-up, 2026-12-01): live/ (kcheck's ctypes bindings of ptrace and perf,
  tempfile; procfs; live/bench/), rewriter/kernel.py (ctypes: the uprobe syscall's answer),
  sequences/ (plan and verify; sequences/protocols/ with keystone for a protocol),
  dtrace/ (subprocess), jsondoc (json: `read_plan` only), forkguard
  (the guard's builder, handed to check: it reads the site analysis, which cannot import it);
- the worker processes of `rewrite_files` with jobs > 1: multiprocessing, concurrent,
  signal and lifetime.py (ctypes);
- importlib, for the names bound on first use; pathlib, for `bench` only (`list` does not
  load it).
Everything else is imported here.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from usdtpatch import heap
from usdtpatch.analysis.forms import ForkGuard, Form, Guard
from usdtpatch.analysis.probes import Probe, ProbeSet, no_match, read_probes
from usdtpatch.elf.demangle import NOT_FOUND, demangle, unavailable
from usdtpatch.elf.image import ElfImage, parse_elf
from usdtpatch.elf.marker import marker_of
from usdtpatch.elf.notes import parse_notes
from usdtpatch.errors import (
    ElfFormatError,
    InputError,
    OutputError,
    UnsupportedError,
    UsdtpatchError,
)
from usdtpatch.findings import CODES, FORM_CHOSEN, KERNEL_OPTIMIZES_NOTHING, RENAMED, Finding
from usdtpatch.io import (
    WRITTEN,
    Origin,
    StrPath,
    check_output,
    map_input,
    read_elf,
    read_input,
    read_source,
    signals_held,
    umask_mode,
    write_atomic,
)
from usdtpatch.kernelfacts import CHOICES as KERNEL_CHOICES
from usdtpatch.kernelfacts import DEFAULT, GENERATIONS, PAGE, Generation, generation

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`list` does not)
if TYPE_CHECKING:  # the deferred modules (see above); the names of _LAZY for type checkers
    from typing import Any, TypeVar

    from usdtpatch.analysis.calls import CALL_CHOICES
    from usdtpatch.analysis.check import CheckReport, GuardBuilder, Keep
    from usdtpatch.live.bench.runner import SYSTEM_JDK, BenchReport
    from usdtpatch.live.kcheck import KcheckReport
    from usdtpatch.rewriter.kernel import FormChoice
    from usdtpatch.rewriter.plan import RewritePlan, SiteDecision, Verifier
    from usdtpatch.sequences.plan import Plan
    from usdtpatch.sequences.protocols import Protocol, ProtocolError
    from usdtpatch.sequences.trampoline import TASK_SIZE
    from usdtpatch.verification.plans import VerifyReport

    E = TypeVar("E", bound=Enum)

__all__ = [
    "CALL_CHOICES",
    "CODES",
    "DEFAULT_KERNEL",
    "GENERATIONS",
    "KERNEL_CHOICES",
    "NOT_FOUND",
    "PAGE",
    "RENAMED",
    "SYSTEM_JDK",
    "TASK_SIZE",
    "WRITTEN",
    "BenchReport",
    "CheckReport",
    "CheckResult",
    "ElfFormatError",
    "FileRewrite",
    "ForkGuard",
    "Form",
    "Generation",
    "Guard",
    "InputError",
    "KcheckReport",
    "OutputError",
    "Plan",
    "Probe",
    "ProbeSet",
    "Protocol",
    "ProtocolError",
    "RestoreOutcome",
    "RewriteOutcome",
    "RewritePlan",
    "Rewritten",
    "SiteDecision",
    "StrPath",
    "UnsupportedError",
    "UsdtpatchError",
    "VerifyReport",
    "bench",
    "check",
    "check_bytes",
    "check_keeping",
    "check_output",
    "copy",
    "demangle",
    "demangle_unavailable",
    "dtrace_header",
    "dtrace_semaphores",
    "kcheck",
    "load",
    "marked",
    "no_match",
    "plan",
    "read_plan",
    "read_protocol",
    "restore",
    "rewrite",
    "rewrite_bytes",
    "rewrite_files",
    "rewrite_plan",
    "umask_mode",
    "verify",
    "write_atomic",
]

# The generation rewrite, check, plan and the build steps target when no --kernel names one
DEFAULT_KERNEL = DEFAULT.name

# The public names of deferred modules, by module: bound on first use (PEP 562).
_LAZY = {
    "CALL_CHOICES": "usdtpatch.analysis.calls",
    "CheckReport": "usdtpatch.analysis.check",
    "SYSTEM_JDK": "usdtpatch.live.bench.runner",
    "BenchReport": "usdtpatch.live.bench.runner",
    "KcheckReport": "usdtpatch.live.kcheck",
    "RewritePlan": "usdtpatch.rewriter.plan",
    "SiteDecision": "usdtpatch.rewriter.plan",
    "Plan": "usdtpatch.sequences.plan",
    "Protocol": "usdtpatch.sequences.protocols",
    "ProtocolError": "usdtpatch.sequences.protocols",
    "TASK_SIZE": "usdtpatch.sequences.trampoline",
    "VerifyReport": "usdtpatch.verification.plans",
}

demangle_unavailable = unavailable  # public name: some names are mangled, c++filt is missing


def __getattr__(name: str) -> Any:
    """A public name of a deferred module, bound on first use."""
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _enum(kind: type[E], value: E | str, option: str) -> E:
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in kind)
        raise ValueError(f"{option}={value!r}: expected one of {choices}") from None


def _flag(name: str, value: object) -> bool:
    """A yes/no argument: True or False only (`verify='no'` is not a yes)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r}: expected True or False")
    return value


def _integer(name: str, value: object, lo: int, hi: int | None = None,
             what: str = "") -> int | None:
    """An int argument (or None) with lo <= value (< hi): TypeError for a str, a float or a
    bool, ValueError out of range, each naming the argument."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r}: expected an int{what} or None")
    if value < lo or (hi is not None and value >= hi):
        bound = f"{lo} <= {name}" + (f" < {hi:#x}" if hi is not None else "")
        raise ValueError(f"{name}={value!r}: expected {bound}{what}")
    return value


def _jobs(jobs: object) -> int | None:
    return _integer("jobs", jobs, 1)


def _placement_args(load_base: object, trampoline: object, pid: object) -> None:
    """plan's and verify's placement arguments: ints in range (TypeError, ValueError)."""
    from usdtpatch.sequences.trampoline import TASK_SIZE

    _integer("load_base", load_base, 0, 1 << 64)
    if _integer("trampoline", trampoline, PAGE, TASK_SIZE) is not None:
        assert isinstance(trampoline, int)
        if trampoline % PAGE:
            raise ValueError(f"trampoline={trampoline:#x}: expected a page address "
                             f"(a multiple of {PAGE:#x})")
    _integer("pid", pid, 1)


def _image(path: StrPath) -> ElfImage:
    return parse_elf(read_elf(path))


def load(path: StrPath, *, mapped: bool = False) -> ProbeSet:
    """Read and parse one file into its probes (raises UsdtpatchError when unusable).
    `mapped`: the file mapped read-only rather than read (usdtpatch.io.map_input: for a
    caller that touches a few parts of many files and keeps no ProbeSet, as `list` does)."""
    return read_probes(parse_elf(map_input(path)) if mapped else _image(path))


def marked(probes: ProbeSet) -> bool:
    """Whether the file of `probes` carries usdtpatch's marker (it was rewritten before)."""
    return marker_of(probes.image) is not None


# ---------------------------------------------------------------------------------- check


@dataclass(frozen=True, slots=True)
class CheckResult:
    """`check`'s verdict on one file: `report` per site, `findings` all of them."""

    path: str
    report: CheckReport = field(repr=False)

    @property
    def findings(self) -> tuple[Finding, ...]:
        """The file's findings, then every site's."""
        return self.report.all_findings


def check(path: StrPath, *, form: Form | str = Form.NOP5,
          redzone_guard: Guard | str = Guard.AUTO,
          fork_guard: ForkGuard | str = ForkGuard.AUTO, calls: str = "auto",
          kernel: str | None = None) -> CheckResult:
    """Judge every probe site of one file as a candidate for the kernel's optimized uprobes;
    the outcomes predict `rewrite` with the same options (`form` "auto" and `kernel` as for
    `rewrite`; UnsupportedError when "auto" finds a kernel that optimizes nothing)."""
    return check_keeping(path, None, form=form, redzone_guard=redzone_guard,
                         fork_guard=fork_guard, calls=calls, kernel=kernel)


def check_keeping(path: StrPath, keep: Callable[[ProbeSet], Keep] | None, *,
                  form: Form | str = Form.NOP5, redzone_guard: Guard | str = Guard.AUTO,
                  fork_guard: ForkGuard | str = ForkGuard.AUTO, calls: str = "auto",
                  kernel: str | None = None) -> CheckResult:
    """`check`, for a writer that puts each site out as it is decided: `keep`, given the
    file's probes before the check, returns what is kept of each site's check once final
    (in address order; usdtpatch.analysis.check.check's `keep`), and the report's sites are
    what that keeps."""
    choice = _form_choice(form, kernel)
    if choice.form is None:
        raise UnsupportedError(choice.why)
    from usdtpatch.analysis.calls import CALL_CHOICES
    from usdtpatch.analysis.check import CheckOptions
    from usdtpatch.analysis.check import check as check_probes

    if calls not in CALL_CHOICES:
        raise ValueError(f"calls={calls!r}: expected one of {', '.join(CALL_CHOICES)}")
    options = CheckOptions(choice.form, _enum(Guard, redzone_guard, "redzone_guard"), calls,
                           _enum(ForkGuard, fork_guard, "fork_guard"))
    probes = load(path)
    return CheckResult(os.fspath(path), check_probes(
        probes, options=options, guard_builder=_guard_builder(),
        keep=None if keep is None else keep(probes)))


def _guard_builder() -> GuardBuilder:
    """The fork guard's builder, as check asks it (usdtpatch.analysis.check.GuardBuilder)."""
    from usdtpatch import forkguard
    from usdtpatch.analysis.check import GuardBuilder

    return GuardBuilder(forkguard.hook_problem)


def check_bytes(path: StrPath, data: bytes) -> CheckResult:
    """`check`, with the default options, of a file's bytes not yet written (`path`: the
    name they will have): the build step checks a rewrite's output before writing it."""
    from usdtpatch.analysis.check import check as check_probes

    return CheckResult(os.fspath(path), check_probes(read_probes(parse_elf(data)),
                                                     guard_builder=_guard_builder()))


# -------------------------------------------------------------------------------- rewrite


@dataclass(frozen=True, slots=True)
class RewriteOutcome:
    """What `rewrite` did to one file.

    `changed`: the output differs from the input. `failed`: a site that should have been
    rewritten could not be (its detour failed verification or relocation); the output is
    still written, with that site as it was. `note` is set when the input was already
    rewritten (nothing decided; the output, if any, is a copy of the input).
    """

    path: str
    output: str | None
    form: Form | None  # None: --form auto found a kernel that optimizes nothing
    redzone_guard: Guard
    fork_guard: ForkGuard
    verified: bool
    changed: bool
    sites: tuple[SiteDecision, ...]
    findings: tuple[Finding, ...]
    note: str | None = None

    @property
    def failed(self) -> bool:
        from usdtpatch.rewriter.plan import sites_failed

        return sites_failed(self.sites)

    @property
    def already_rewritten(self) -> bool:
        return self.note is not None


def _validate(data: bytes, original: ElfImage) -> None:
    """Check a rewrite's output before it is renamed into place; raises OutputError."""
    from usdtpatch.elf.validate import validate_output  # here: pyelftools only when writing

    validate_output(data, original)


def _decide(image: ElfImage, *, verify: bool, jobs: int | None, prove: bool = True,
            phase: Callable[[str], None] | None = None, **options: Any) -> RewritePlan:
    """plan_rewrite with every detour verified (when `verify`): proved where the prover can
    (usdtpatch.prove.verifier, `prove` on), the others by the emulator, in `jobs` processes
    (usdtpatch.verification.equivalence.plan_verified; None: one per CPU this process may
    use; each worker proves and emulates its detours). `phase("verify")` is called when a
    planning pass has handed its detours to the verification and waits for it."""
    from usdtpatch.analysis.check import check as check_probes
    from usdtpatch.rewriter.plan import check_rewritable, plan_rewrite

    if not verify:
        return plan_rewrite(image, verify=None, **options)
    from usdtpatch.verification.equivalence import PENDING, plan_verified

    # Only the notes are counted here: plan_verified forks its workers before the analysis
    # (read_probes loads the symbol tables), while this process is still small.
    sec = image.section(".note.stapsdt")
    expected = 0
    if sec is not None and image.is64 and image.little_endian:
        expected = len(parse_notes(image.section_data(sec), 8, "<").sdt_notes)
    report: list[Any] = []
    wrap: Any = None
    if prove:  # imported before the workers fork: they share the engines' pages
        from usdtpatch.prove.verifier import ProvingVerifier

        wrap = ProvingVerifier  # each process's own, with its own prover (its answers kept)
    given: list[Verifier] = []

    def plan(verifier: Verifier) -> RewritePlan:
        if not report:  # once: later passes take the same analysis
            check_rewritable(image)
            ps = read_probes(image)
            report.append(check_probes(ps) if ps.notes is not None and ps.probes else None)
        given[:] = [verifier]
        planned = plan_rewrite(image, verify=verifier, report=report[0], **options)
        if phase is not None:
            phase("verify")
        return planned

    planned = plan_verified(image, plan, jobs=jobs, expected=expected, wrap=wrap,
                            progress=options.get("progress"))
    method = getattr(given[0], "method", None) if given else None
    if method is None:  # verified in this process: each site's method known when planned
        return planned
    # verified by workers: the methods of the answers that were not back when planned
    sites = tuple(replace(s, verification=method(laid))
                  if (laid := s.detour or s.relaid) is not None and s.verification == PENDING
                  else s for s in planned.sites)
    return replace(planned, sites=sites)


def _sound_rewritten(image: ElfImage) -> None:
    """Refuse (ElfFormatError) a file with a marker whose probes `list` could not read: it
    would otherwise be copied as "already rewritten"."""
    read_probes(image)


def _form_choice(form: Form | str, kernel: str | None) -> FormChoice:
    """The form of a rewrite: `form`, or for "auto" the kernel's (usdtpatch.rewriter.kernel);
    ValueError for a value that is neither."""
    from usdtpatch.rewriter.kernel import AUTO, choose_form

    if form != AUTO and not isinstance(form, Form) and form not in {f.value for f in Form}:
        raise ValueError(f"form={form!r}: expected one of {AUTO}, "
                         f"{', '.join(f.value for f in Form)}")  # "auto", rewrite's default
    return choose_form(form if form == AUTO else _enum(Form, form, "form"),
                       None if kernel is None else _generation(kernel))


def _generation(kernel: str) -> Generation:
    """The optimizing generation `kernel` names (its name or an alias, kernelfacts.CHOICES)."""
    if kernel not in KERNEL_CHOICES:
        raise ValueError(f"kernel={kernel!r}: expected one of {', '.join(KERNEL_CHOICES)}")
    return generation(kernel)


def rewrite(path: StrPath, out: StrPath | None = None, *, form: Form | str = "auto",
            redzone_guard: Guard | str = Guard.AUTO,
            fork_guard: ForkGuard | str = ForkGuard.AUTO,
            verify: bool = True, in_place: bool = False,
            progress: Callable[[int, int], None] | None = None,
            calls: str = "auto", jobs: int | None = None,
            kernel: str | None = None, prove: bool = True,
            phase: Callable[[str], None] | None = None,
            keep_build_id: bool = False) -> RewriteOutcome:
    """Turn the 1-byte probe sites of `path` into 5-byte NOP sites.

    The output goes to `out` (a new regular file, or an existing one replaced atomically,
    with the input's permission bits), or over `path` with `in_place=True`; with neither,
    nothing is written (a dry run: the decisions only). `verify` (default on) runs every
    detour against the original first (proved equivalent where the prover can, with `prove`
    on, else in the emulator; each site's `verification` says which); a site that fails
    stays as it was and the outcome says `failed`. An input rewritten before is an outcome
    with `note` set, copied to `out` unchanged; in place, a file where nothing changes is
    not written (its mtime stays). Raises UsdtpatchError when the file cannot be
    used or the output cannot be written (an output that is the input, or not a regular
    file).
    `calls` (auto | move | emulate): how calls inside a patch window go along
    (docs/rewrite.md, "Windows that hold a call"). `jobs`: processes verifying detours in
    parallel (None: one per CPU; the decisions do not depend on it). `form` "auto" (the
    default) takes the form the kernel optimizes: the running kernel's (usdtpatch.rewriter.
    kernel), or the generation `kernel` names ("nop5" or "nop10", KERNEL_CHOICES); the outcome's
    findings say which and why, and where the kernel optimizes nothing the file is left as it
    is (copied to `out`). `progress(done, total)` is called as the sites are decided, then
    `phase(name)` as each later phase starts: "verify" (the proofs and the emulator's check
    of the detours, in worker processes; `progress(done, total)` again as their answers come
    back, counting detours), "build", "check" (the independent reader of the output),
    "write".
    The output gets a build-id of its own, derived from the original's (which the marker
    keeps), unless `keep_build_id` (docs/rewrite.md, "Debugging information").
    """
    r = rewrite_bytes(path, out, form=form, redzone_guard=redzone_guard,
                      fork_guard=fork_guard, verify=verify, in_place=in_place,
                      progress=progress, calls=calls, jobs=jobs, kernel=kernel, prove=prove,
                      phase=phase, keep_build_id=keep_build_id)
    o = r.outcome
    if o.output is not None and r.data is not None and (o.changed or not in_place):
        # in place and unchanged (no site converts): the file is left as it is, mtime too
        if phase is not None:
            phase("write")
        r.write()
    return o


@dataclass(frozen=True, slots=True)
class Rewritten:
    """`rewrite_bytes`'s answer: the outcome, the bytes for its output (None: nothing to
    write: a dry run) and what the output keeps of the input (its permission bits, and in
    place its owner: usdtpatch.io.Origin)."""

    outcome: RewriteOutcome
    data: bytes | None = field(repr=False)
    origin: Origin = field(repr=False)
    in_place: bool = False

    def write(self, to: StrPath | None = None) -> None:
        """Write the bytes atomically to the outcome's output, or to `to` (a new file with
        the input's permission bits: not in place)."""
        if self.data is None or (to is None and self.outcome.output is None):
            raise ValueError("rewrite_bytes: nothing to write (a dry run)")
        target = to if to is not None else self.outcome.output
        assert target is not None
        write_atomic(target, self.data, origin=self.origin,
                     in_place=self.in_place and to is None)


def rewrite_bytes(path: StrPath, out: StrPath | None = None, *, form: Form | str = "auto",
                  redzone_guard: Guard | str = Guard.AUTO,
                  fork_guard: ForkGuard | str = ForkGuard.AUTO,
                  verify: bool = True, in_place: bool = False,
                  progress: Callable[[int, int], None] | None = None, calls: str = "auto",
                  jobs: int | None = None, kernel: str | None = None, prove: bool = True,
                  phase: Callable[[str], None] | None = None, keep_build_id: bool = False
                  ) -> Rewritten:
    """`rewrite`'s work without the write (the options are `rewrite`'s; `out` and
    `in_place` name the output the bytes are for, and are checked as `rewrite` checks
    them): the caller looks at the bytes first and writes them with `Rewritten.write`, as
    the build step (usdtpatch.integrate.step) does after checking them."""
    _flag("verify", verify)
    _flag("prove", prove)
    _flag("in_place", in_place)
    _flag("keep_build_id", keep_build_id)
    _jobs(jobs)
    choice = _form_choice(form, kernel)
    g = _enum(Guard, redzone_guard, "redzone_guard")
    fg = _enum(ForkGuard, fork_guard, "fork_guard")
    src = os.fspath(path)
    if in_place and out is not None and os.fspath(out) != src:
        raise ValueError("rewrite: give `out` or in_place=True, not both")
    target = src if in_place else (os.fspath(out) if out is not None else None)
    if target is not None:
        check_output(target, [src], in_place=in_place)
    data, origin = read_source(src, in_place)
    image = parse_elf(data)
    f = choice.form
    said = (FORM_CHOSEN.finding(choice.why),) if choice.detected or choice.kernel else ()
    copy = data if target is not None and not in_place else None  # the input, unchanged

    def outcome(changed: bool, sites: tuple[SiteDecision, ...] = (),
                findings: tuple[Finding, ...] = (), note: str | None = None) -> RewriteOutcome:
        return RewriteOutcome(path=src, output=target, form=f, redzone_guard=g, fork_guard=fg,
                              verified=verify, changed=changed, sites=sites,
                              findings=findings if note is not None else said + findings, note=note)

    def answer(o: RewriteOutcome, data: bytes | None) -> Rewritten:
        return Rewritten(outcome=o, data=data, origin=origin, in_place=in_place)

    if f is None:  # a kernel that optimizes nothing: the file stays as it is
        nothing = (KERNEL_OPTIMIZES_NOTHING.finding(choice.why),)
        return answer(RewriteOutcome(path=src, output=target, form=None, redzone_guard=g,
                                     fork_guard=fg, verified=verify, changed=False, sites=(),
                                     findings=nothing), copy)
    from usdtpatch.rewriter.marker import AlreadyRewritten

    try:
        rp = _decide(image, verify=verify, jobs=jobs, prove=prove, form=f, guard=g,
                     fork_guard=fg, progress=progress, calls=calls, phase=phase,
                     windows=False)  # the decisions keep their windows' spans only
    except AlreadyRewritten as exc:
        _sound_rewritten(image)
        return answer(outcome(False, note=str(exc)), copy)
    from usdtpatch.analysis.hazards import forget_context

    forget_context()  # the plan is made: the check's context is not read again
    if rp.fork_refusal is not None:  # the plan's decision: a dry run refuses it too
        raise UnsupportedError(rp.fork_refusal)
    changed, sites, found = rp.changed, rp.sites, rp.findings
    if target is None:
        return answer(outcome(changed, sites, found), None)
    result = data
    say = phase if phase is not None else (lambda _name: None)
    if changed:
        from usdtpatch.rewriter.build import build_rewrite

        say("build")
        result = build_rewrite(rp, keep_build_id)
        # the outcome keeps the decisions only: the plan's segment, unwind rows and tables
        # go before the output check reads the new file again (issue 38, rewrite's memory)
        del rp
        heap.give_back()  # what the plan freed, before the output check allocates (usdtpatch.heap)
        say("check")
        _validate(result, image)
    return answer(outcome(changed, sites, found), result)


def copy(path: StrPath, out: StrPath) -> None:
    """`path`'s bytes to `out` unchanged, atomically, with its permission bits (the build
    step's output when it only checks)."""
    check_output(out, [path])
    data, origin = read_source(os.fspath(path))
    write_atomic(out, data, origin=origin)


# ---------------------------------------------------------------------- many files at once


@dataclass(frozen=True, slots=True)
class FileRewrite:
    """One file of `rewrite_files`: its outcome, or the UsdtpatchError that refused it; the
    seconds its rewrite took, and its size before (None: it could not be measured)."""

    path: str
    outcome: RewriteOutcome | None
    error: UsdtpatchError | None
    seconds: float
    size_before: int | None


# `rewrite_files`' `watch(path)`: the `progress` and `phase` of that file's `rewrite`
Watch = Callable[[str], tuple[Callable[[int, int], None] | None, Callable[[str], None] | None]]


def rewrite_files(todo: Sequence[tuple[StrPath, StrPath | None]], *, jobs: int = 1,
                  watch: Watch | None = None, form: Form | str = "auto",
                  redzone_guard: Guard | str = Guard.AUTO,
                  fork_guard: ForkGuard | str = ForkGuard.AUTO, verify: bool = True,
                  in_place: bool = False, calls: str = "auto", kernel: str | None = None,
                  prove: bool = True, keep_build_id: bool = False) -> Iterator[FileRewrite]:
    """`rewrite` of each (input, output) of `todo` (output None: in place with `in_place`,
    else a dry run), one answer per file in the order of `todo`; a file refused (a
    UsdtpatchError) is an answer too, and the next file is rewritten. With `jobs` > 1 the
    files are rewritten in that many worker processes (forked; each verifies its detours
    in its own process), which die with this one; `watch` is asked, for a file rewritten in
    this process, the progress callbacks of its rewrite. On Ctrl-C (KeyboardInterrupt) the
    workers stop their files cleanly, the outputs they put in place are added to
    usdtpatch.io.WRITTEN, and the interrupt goes on."""
    _integer("jobs", jobs, 1)
    options: dict[str, Any] = {
        "form": form, "redzone_guard": redzone_guard, "fork_guard": fork_guard,
        "verify": verify, "in_place": in_place, "calls": calls, "kernel": kernel,
        "prove": prove, "keep_build_id": keep_build_id}
    files = [(os.fspath(p), None if t is None else os.fspath(t)) for p, t in todo]
    if jobs > 1:
        yield from _in_workers(files, jobs, options)
        return
    for p, t in files:
        size = _size(p)
        t0 = time.monotonic()
        progress, phase = watch(p) if watch is not None else (None, None)
        try:
            o = rewrite(p, t, progress=progress, phase=phase, **options)
        except UsdtpatchError as exc:
            yield FileRewrite(path=p, outcome=None, error=exc, seconds=time.monotonic() - t0,
                              size_before=size)
            continue
        yield FileRewrite(path=p, outcome=o, error=None, seconds=time.monotonic() - t0,
                          size_before=size)


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _in_workers(files: list[tuple[str, str | None]], jobs: int,
                options: dict[str, Any]) -> Iterator[FileRewrite]:
    """`rewrite_files` in `jobs` worker processes, one process per file."""
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    sizes = {p: _size(p) for p, _ in files}  # before any file is rewritten in place
    # forked (as on Linux by default up to Python 3.13): a worker's parent is this process
    context = multiprocessing.get_context("fork")
    stop = context.Event()  # set before the workers' Ctrl-C: a file begun after it stops
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init,
                               initargs=(os.getpid(), stop), mp_context=context)
    futures: list[tuple[str, Future[tuple[RewriteOutcome, float]]]] = []
    try:
        futures = [(p, pool.submit(_rewrite_in_worker, p, t, options)) for p, t in files]
        for p, fut in futures:
            try:
                o, took = fut.result()
            except UsdtpatchError as exc:
                yield FileRewrite(path=p, outcome=None, error=exc, seconds=0.0,
                                  size_before=sizes[p])
                continue
            yield FileRewrite(path=p, outcome=o, error=None, seconds=took, size_before=sizes[p])
    except BaseException as exc:
        # a second interrupt (each worker that renamed an output may be signalled, or a
        # second Ctrl-C) comes after the workers stopped and what they wrote is noted: it
        # lost the record once, and the line said that nothing was written
        with signals_held():
            if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, SIGTERM, SIGHUP of this process
                stop.set()
                _interrupt_workers(pool)
            pool.shutdown(wait=True, cancel_futures=True)
            _note_written(f for _, f in futures)
        raise
    pool.shutdown(wait=True)


# In a worker of rewrite_files: "stop", the event the parent sets before it sends its workers
# Ctrl-C.
_WORKER: dict[str, Any] = {}


def _worker_init(parent: int, stop: Any) -> None:
    """A worker ignores Ctrl-C while idle (the parent stops the pool: no tracebacks) and
    dies with its parent."""
    import signal

    from usdtpatch.lifetime import die_with_parent

    _WORKER["stop"] = stop
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _interrupt_workers(pool: Any) -> None:
    """Ctrl-C for every worker (one that works on a file stops it cleanly, an idle one ignores
    it and ends at shutdown): the parent may have been signalled alone (SIGTERM, kill -INT),
    not the whole process group as a terminal does."""
    import signal

    processes: dict[int, Any] = getattr(pool, "_processes", None) or {}  # pid -> process
    for pid in list(processes):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)


def _note_written(futures: Iterator[Any]) -> None:
    """After an interrupt: the outputs the workers put in place (finished files, and files
    whose rename was done when the interrupt came), for the interrupt's line."""
    for fut in futures:
        if not fut.done() or fut.cancelled():
            continue
        exc = fut.exception()
        if exc is None:
            output = fut.result()[0].output
            WRITTEN.extend([output] if output else [])
        else:
            WRITTEN.extend(getattr(exc, "written", []))


def _rewrite_in_worker(path: str, target: str | None,
                       options: dict[str, Any]) -> tuple[RewriteOutcome, float]:
    """One file in a worker process: its outcome and the time its rewrite took."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C stops this file cleanly
    mark = len(WRITTEN)
    try:
        # A Ctrl-C the parent sent while this worker was idle or starting (ignored then) is
        # seen here: the parent sets the event first, so either it is set now or the signal
        # comes after the handler above (before: the file ran to its end, the parent waiting)
        stop = _WORKER.get("stop")
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        t0 = time.monotonic()
        # the files run in parallel: one process per file (jobs=1), no verifying workers
        o = rewrite(path, target, jobs=1, **options)
        return o, time.monotonic() - t0
    except KeyboardInterrupt as exc:  # the parent says whether this file was written
        exc.written = WRITTEN[mark:]  # type: ignore[attr-defined]  # pickled with it
        raise
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def rewrite_plan(path: StrPath, *, form: Form | str = Form.NOP5,
                 redzone_guard: Guard | str = Guard.AUTO,
                 fork_guard: ForkGuard | str = ForkGuard.AUTO,
                 verify: bool = True, calls: str = "auto", jobs: int | None = None,
                 kernel: str | None = None, prove: bool = True) -> RewritePlan:
    """The decisions a rewrite of `path` would take (frozen data), without building a file.

    `form` "auto" and `kernel` as for `rewrite`; UnsupportedError when "auto" finds a
    kernel that optimizes nothing. Raises usdtpatch.rewriter.marker.AlreadyRewritten for a
    file rewritten before."""
    _flag("verify", verify)
    _flag("prove", prove)
    _jobs(jobs)
    choice = _form_choice(form, kernel)
    if choice.form is None:
        raise UnsupportedError(choice.why)
    return _decide(_image(path), verify=verify, jobs=jobs, prove=prove, form=choice.form,
                   guard=_enum(Guard, redzone_guard, "redzone_guard"),
                   fork_guard=_enum(ForkGuard, fork_guard, "fork_guard"), calls=calls)


# -------------------------------------------------------------------------------- restore


@dataclass(frozen=True, slots=True)
class RestoreOutcome:
    """What `restore` gave back: the original's bytes (written to `output` unless None)."""

    path: str
    output: str | None
    data: bytes = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.data)


def restore(path: StrPath, out: StrPath | None = None, *,
            in_place: bool = False) -> RestoreOutcome:
    """The original of a rewritten file, byte for byte (checked against its sha256), written
    atomically to `out` or over `path` with `in_place=True` (neither: returned only)."""
    _flag("in_place", in_place)
    src = os.fspath(path)
    if in_place and out is not None and os.fspath(out) != src:
        raise ValueError("restore: give `out` or in_place=True, not both")
    target = src if in_place else (os.fspath(out) if out is not None else None)
    if target is not None:
        check_output(target, [src], in_place=in_place)
    data, origin = read_source(src, in_place)
    from usdtpatch.rewriter.marker import restore_image

    original = restore_image(parse_elf(data))
    if target is not None:
        write_atomic(target, original, origin=origin, in_place=in_place)
    return RestoreOutcome(src, target, original)


# ------------------------------------------------------------------------- plan and verify


def _plan_of(ps: ProbeSet, path: str, form: str, load_base: int | None,
             trampoline: int | None, maps: StrPath | None, pid: int | None,
             red_zone: Mapping[int, str] | None = None) -> Plan:
    from usdtpatch.sequences.plan import plan_for

    entries = None
    mmap_min = 4096
    source_name = ""
    if maps is not None or pid is not None:
        from usdtpatch.live import procfs

        if maps is not None:
            entries = procfs.read_maps_file(os.fspath(maps))
            source_name = os.fspath(maps)
        else:
            assert pid is not None
            entries = procfs.read_maps(pid)
            source_name = f"pid {pid}"
            mmap_min = procfs.mmap_min_addr()
    return plan_for(ps, path, form, load_base=load_base, maps=entries, maps_source=source_name,
                    trampoline=trampoline, mmap_min_addr=mmap_min, red_zone=red_zone)


def _placement(trampoline: int | None, maps: StrPath | None, pid: int | None) -> None:
    if sum(x is not None for x in (trampoline, maps, pid)) > 1:
        raise ValueError("give at most one of trampoline, maps, pid")


def plan(path: StrPath, *, form: str = "nop5", load_base: int | None = None,
         trampoline: int | None = None, maps: StrPath | None = None,
         pid: int | None = None, protocol: Protocol | None = None) -> Plan:
    """The kernel's write sequences for every probe site of `path` (`form`: the name of the
    generation whose protocol is planned, "nop5" or "nop10"). The trampoline page comes from
    `trampoline`, a /proc/PID/maps snapshot `maps`, a live process `pid`, or the loader's
    layout at `load_base` (default: 0x555555554000 for PIE, 0 otherwise). With `protocol`
    (`read_protocol`), the plan of its model (instead of `form`) with the protocol's
    sequences on every site the model optimizes; ProtocolError when its statements do not
    fit a site."""
    _placement_args(load_base, trampoline, pid)
    _placement(trampoline, maps, pid)
    src = os.fspath(path)
    if protocol is None:
        return _plan_of(load(src), src, form, load_base, trampoline, maps, pid)
    from usdtpatch.sequences.protocols import apply_protocol

    model = _plan_of(load(src), src, protocol.model, load_base, trampoline, maps, pid)
    return apply_protocol(model, protocol)


def read_protocol(path: StrPath) -> Protocol:
    """A write protocol file read (docs/plan-verify.md; usdtpatch/sequences/protocols/
    nop5.toml is the kernel's), for `plan(protocol=...)`; ProtocolError naming the file."""
    from usdtpatch.sequences.protocols import load_protocol

    return load_protocol(os.fspath(path))


def read_plan(path: StrPath) -> Plan:
    """A plan document (`usdtpatch plan --json`, or anyone's) read back."""
    from usdtpatch import jsondoc  # here, not at the top: `check` and `list` do not pay
    from usdtpatch.sequences.plan import plan_from_json

    src = os.fspath(path)
    try:
        doc = jsondoc.loads(read_input(src))
    except ValueError as exc:  # not JSON, not UTF-8, nested too deep, a 5,000-digit number
        raise InputError(f"{src}: not a JSON document: {exc}") from exc
    return plan_from_json(doc, src)


def verify(path: StrPath, *, plan: Plan | StrPath | None = None, form: str = "nop5",
           load_base: int | None = None, trampoline: int | None = None,
           maps: StrPath | None = None, pid: int | None = None) -> VerifyReport:
    """Run every torn state of every write sequence for `path` in the emulator: `plan` (a
    Plan, or the path of a plan document), else the plan made with the placement options."""
    from usdtpatch.sequences.plan import Plan as PlanType
    from usdtpatch.sequences.plan import red_zone_users
    from usdtpatch.verification.plans import verify_plan

    _placement_args(load_base, trampoline, pid)
    src = os.fspath(path)
    ps = load(src)
    users = red_zone_users(ps)  # check's red-zone rule, asked once for the plan and verify
    if isinstance(plan, PlanType):
        the_plan = plan
    elif plan is not None:
        the_plan = read_plan(plan)
    else:
        _placement(trampoline, maps, pid)
        the_plan = _plan_of(ps, src, form, load_base, trampoline, maps, pid, users)
    rep = verify_plan(the_plan, ps.image, users)
    # fork (docs/fork-guard.md): the child of a process whose nop5 sites are optimized
    from usdtpatch.verification.fork import fork_findings

    optimized = tuple(s.link_address for s in the_plan.sites
                      if s.sequences is not None and s.sequences.protocol == "nop5"
                      and s.sequences.optimize is not None)
    return replace(rep, findings=rep.findings + fork_findings(ps.image, optimized,
                                                                the_plan.load_base))


# --------------------------------------------------------------------------------- kcheck


def kcheck(path: StrPath, *, command: Sequence[str] | None = None, pid: int | None = None,
           probes: Sequence[str] = (), duration: float = 5.0, settle: float = 2.0,
           progress: Callable[[str], None] | None = None,
           command_stdout: int | None = None) -> KcheckReport:
    """What the running kernel does with the probe sites of `path` (an executable, or a library the
    process maps; docs/kcheck.md). A uprobe goes on every site (with `probes`, on those whose
    provider:name matches one of these shell patterns; the sites are probes of one trace event
    sampled per CPU, the process's hits told apart by pid) for one process: `command`, an argv
    list started here and followed with its threads and forks to its end (its remaining children
    for `settle` seconds more), or the running process `pid`, watched for `duration` seconds and
    then detached (it keeps running). Nothing stays attached. `progress` gets a line for each
    step worth telling. `command_stdout`, a file descriptor, becomes the command's standard
    output (`kcheck --json` gives its stderr, so that the command's output stays out of the
    document).

    The report (usdtpatch.live.kcheck.KcheckReport; usdtpatch.report.kcheck.kcheck_json makes
    the `kcheck --json` document of it) has per process and site the hits, the bytes while
    attached and after detach and what `plan` predicts; `.problems` lists what did not go as
    planned, for the running kernel's generation (told by the uprobe syscall's answer).
    Raises UnsupportedError where kcheck cannot run (not root, no uprobe PMU, an answer of
    the uprobe syscall no generation gives), InputError for a file without probe sites, a
    command that cannot be run or a pid that is no process or does not map `path`, ValueError
    for arguments that do not fit (neither or both of `command` and `pid`, an empty command, a
    string where a list is expected, a `duration` that is not positive or a negative `settle`)."""
    if (command is None) == (pid is None):
        raise ValueError("kcheck: give `command` or `pid`, one of them")
    if isinstance(command, str) or isinstance(probes, str):
        raise ValueError("kcheck: `command` and `probes` are lists of strings, not a string")
    if command is not None and not command:
        raise ValueError("kcheck: `command` is empty")
    if not duration > 0:
        raise ValueError(f"kcheck: duration={duration!r}: expected seconds > 0")
    if not settle >= 0:
        raise ValueError(f"kcheck: settle={settle!r}: expected seconds >= 0")
    from usdtpatch.live import kcheck as live

    gen = live.kernel_support()
    run = live.Kcheck(os.fspath(path), settle=settle, probes=probes, progress=progress, gen=gen)
    if command is not None:
        return run.run_command(list(command), stdout=command_stdout)
    assert pid is not None  # one of the two, checked above
    return run.run_pid(pid, duration)


# --------------------------------------------------------------------------------- dtrace


def dtrace_header(script: StrPath, *, cpp: bool = False, includes: Sequence[str] = (),
                  defines: Sequence[str] = (), semaphores: bool = True) -> str:
    """The probe header systemtap's `dtrace -h -s SCRIPT` would write, over usdtpatch's
    sys/sdt.h (`cpp`: run the C preprocessor over the script first, with `includes` and
    `defines`)."""
    from usdtpatch.dtrace.header import render_header
    from usdtpatch.dtrace.script import load_script

    return render_header(load_script(os.fspath(script), cpp, list(includes), list(defines)),
                         semaphores)


def dtrace_semaphores(script: StrPath, *, cpp: bool = False, includes: Sequence[str] = (),
                      defines: Sequence[str] = (), semaphores: bool = True) -> str:
    """The C source of the object systemtap's `dtrace -G -s SCRIPT` would build: the
    semaphores of the script's probes (options as for `dtrace_header`)."""
    from usdtpatch.dtrace.header import render_stub_source
    from usdtpatch.dtrace.script import load_script

    return render_stub_source(load_script(os.fspath(script), cpp, list(includes),
                                          list(defines)), semaphores)


# ---------------------------------------------------------------------------------- bench


def bench(*, include_dir: StrPath, iterations: int = 2_000_000, repeats: int = 5,
          jvm_calls: int = 2_000_000, trigger: bool = True, jvm: bool = True, cc: str = "cc",
          jdk: StrPath | None = None, workdir: StrPath | None = None,
          progress: Callable[[str], None] | None = None) -> BenchReport:
    """Tracing speed on this machine (docs/performance.md; usdtpatch.live.bench.runner):
    programs built with the sys/sdt.h in `include_dir`, rewritten with `rewrite`, traced
    with real uprobes in `repeats` interleaved rounds; `jdk` (default SYSTEM_JDK) is copied,
    never modified."""
    from pathlib import Path

    from usdtpatch.live.bench import runner

    return runner.bench(runner.Tools(rewrite, Path(include_dir)), iterations=iterations,
                        repeats=repeats, jvm_calls=jvm_calls, trigger=trigger, jvm=jvm, cc=cc,
                        jdk=runner.SYSTEM_JDK if jdk is None else Path(jdk),
                        workdir=None if workdir is None else Path(workdir), progress=progress)
