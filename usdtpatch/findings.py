"""Findings and the one registry of finding codes.

A finding is not an exception: it goes into the report and the run goes on. Each has a
stable kebab-case `code`, a severity, a message that shows the bad value, and a hint that says
what to do about it. This module sits below every layer that emits findings (analysis, sequences,
verification, rewriter) and the one that renders them (report); it imports nothing of usdtpatch.

Every code the program can emit is registered here once (`CODES`), with its severity, a
title, a default hint and its anchor in docs/findings.md. Emitting code refers to the
registry's constants, never to a string literal; `Finding`, and every other holder of a
code, calls `lookup`, which raises on a code that is not registered.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType


class Severity(Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return {"info": 0, "warning": 1, "error": 2}[self.value]


class Kind(Enum):
    """Where a code is reported."""

    FINDING = "finding"  # a finding of list/check/plan/verify/rewrite
    VERIFY_FAILURE = "verify-failure"  # a reason the emulator rejects a plan's sequences
    REWRITE_SKIP = "rewrite-skip"  # why rewrite leaves a site unchanged


DOC = "docs/findings.md"
# The same page as package data (usdtpatch/data/findings.md, a link to docs/findings.md in the
# source tree; wheels carry the file): `usdtpatch explain` and SARIF's rule help read it.
_SHIPPED_DOC = os.path.join(os.path.dirname(__file__), "data", "findings.md")


@dataclass(frozen=True, slots=True)
class Code:
    """One registered finding code."""

    code: str
    severity: Severity
    title: str
    hint: str
    kinds: frozenset[Kind]
    # the other severities a finding of this code may have (process-can-fork: a warning
    # where no site is optimized as it is); `explain` and the documentation name them all
    also: tuple[Severity, ...] = ()

    @property
    def severities(self) -> tuple[Severity, ...]:
        """Every severity a finding of this code may have, the registered one first."""
        return (self.severity, *self.also)

    @property
    def severity_text(self) -> str:
        """The severities as `explain` and docs/findings.md write them ("error or warning")."""
        return " or ".join(s.value for s in self.severities)

    @property
    def anchor(self) -> str:
        """Where the code is documented: docs/findings.md#<code> (the heading is the code)."""
        return f"{DOC}#{self.code}"

    def __str__(self) -> str:
        return self.code

    def finding(self, message: str, where: str = "", severity: Severity | None = None
                ) -> Finding:
        """A Finding of this code, with the registered hint and, unless given, the registered
        severity (one the code is not registered with is a programming error). The hint is
        always the registry's: what `explain`, SARIF's rule help and the report say of a code
        is one text; what differs between two findings of a code is in their messages."""
        if severity is not None and severity not in self.severities:
            raise AssertionError(f"finding code {self.code!r} is not registered with severity "
                                 f"{severity.value} ({self.severity_text})")
        return Finding(code=self.code, severity=self.severity if severity is None else severity,
                       message=message, hint=self.hint, where=where)


_REGISTRY: dict[str, Code] = {}


def _code(code: str, severity: Severity, title: str, hint: str = "",
          kinds: Kind | tuple[Kind, ...] = Kind.FINDING, also: tuple[Severity, ...] = ()
          ) -> Code:
    if code in _REGISTRY:
        raise AssertionError(f"finding code {code!r} registered twice")
    entry = Code(code=code, severity=severity, title=title, hint=hint,
                 kinds=frozenset(kinds if isinstance(kinds, tuple) else (kinds,)), also=also)
    _REGISTRY[code] = entry
    return entry


class UnknownCode(ValueError):
    """A finding code that is not in the registry (a programming error, never input)."""


def lookup(code: str) -> Code:
    """The registry entry of `code`; raises UnknownCode when it is not registered."""
    try:
        return _REGISTRY[code]
    except KeyError:
        raise UnknownCode(f"finding code {code!r} is not registered in usdtpatch.findings"
                          ) from None


def is_registered(code: str) -> bool:
    return code in _REGISTRY


@functools.cache
def _doc_sections() -> dict[str, str]:
    """docs/findings.md's section of every code (the text under its "### `code`" heading),
    from the copy shipped in the package; empty when it is missing (a broken install)."""
    try:
        with open(_SHIPPED_DOC, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    sections: dict[str, str] = {}
    code: str | None = None
    lines: list[str] = []
    skipping = False  # inside the "triggered by" item: the project's own test inputs
    for line in [*text.splitlines(), "## end"]:
        if line.startswith(("## ", "### ")):
            if code is not None:
                sections[code] = "\n".join(lines).strip()
            head = line[4:].strip() if line.startswith("### ") else ""
            code = head.strip("`") if head.startswith("`") and head.endswith("`") else None
            lines = []
            skipping = False
        elif code is not None:
            if line.startswith("- "):
                skipping = line.startswith("- triggered by")
            if not skipping:
                lines.append(line)
    return sections


def documentation(code: str) -> str:
    """The documentation of a registered `code` (its docs/findings.md section: severity,
    meaning, hint; not the test inputs that trigger it), or "" when the shipped page lacks
    it. Raises
    UnknownCode for a code that is not registered."""
    lookup(code)
    return _doc_sections().get(code, "")


@dataclass(frozen=True, slots=True)
class Finding:
    code: str
    severity: Severity
    message: str
    hint: str = ""
    where: str = ""  # e.g. "python:audit" or ".note.stapsdt+0x1c4"

    def __post_init__(self) -> None:
        lookup(self.code)  # an unregistered code is a programming error: fail where it is made

    def to_json(self) -> dict[str, str]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "where": self.where,
            "message": self.message,
            "hint": self.hint,
        }


# The registry. Codes are grouped as docs/findings.md groups them; each heading there is the
# code itself, so its anchor is the code.
_I, _W, _E = Severity.INFO, Severity.WARNING, Severity.ERROR
_F, _V, _S = Kind.FINDING, Kind.VERIFY_FAILURE, Kind.REWRITE_SKIP
_INT3_PATH = "the site stays on the int3 path"
_BLOCK_HINT = ("the site stays on the int3 path; rebuild with a header that emits a 5-byte NOP "
               "(usdtpatch's sdt.h, or usdt.h)")

# -- from the notes (list and check) --
NOTE_MALFORMED = _code("note-malformed", _E, "an SDT note cannot be parsed",
                       "this note is skipped; the other notes are listed")
NOTE_FOREIGN = _code("note-foreign", _I, "a note that is not an SDT note", "kept unchanged")
NOTE_TRUNCATED = _code("note-truncated", _E, "the note section ends inside a note",
                       "the section is damaged; the notes before it are listed")
ARG_UNKNOWN_FORM = _code("arg-unknown-form", _W, "an argument operand no parser understands",
                         "kept as text; tracers may not read this argument")
ARG_NO_SIZE = _code("arg-no-size", _I, "an argument without the N@ size prefix",
                    "tracers read it as an 8-byte value")
TOO_MANY_ARGS = _code("too-many-args", _W, "more than 12 arguments",
                      "tracers may ignore the arguments past the twelfth")
PC_OUTSIDE_SEGMENTS = _code("pc-outside-segments", _E, "the probe address maps to no file bytes",
                            "the note or the file is damaged", (_F, _S))
SITE_PROBE_LOST = _code("site-probe-lost", _W,
                        "a probe at this pc is lost on some kernel generations",
                        "put a 1-byte nop before a nop10 (combo10, as usdt.h writes it) so "
                        "that every kernel probes the note's pc", (_F, _S))
UNSUPPORTED_ARCH = _code("unsupported-arch", _I, "not x86 code",
                         "usdtpatch rewrites x86-64 only")
BIG_ENDIAN = _code("big-endian", _E, "a big-endian x86 ELF file",
                   "probes are listed; usdtpatch rewrites little-endian x86-64 only")
NOT_LINKED = _code("not-linked", _E, "not a linked file (ET_EXEC or ET_DYN)",
                   "rewrite the linked file")
NO_STAPSDT_BASE = _code("no-stapsdt-base", _I, "no .stapsdt.base section",
                        "note addresses are used as they are")
NOTE_BASE_MOVED = _code("note-base-moved", _I, "the notes' base differs from .stapsdt.base",
                        "pc and semaphore are adjusted as libbpf and gdb do")
NOTE_SECTION_TYPE = _code("note-section-type", _W, ".note.stapsdt is not SHT_NOTE",
                          "it is read anyway")

# -- the kernel's verdict on a site (usdtpatch.analysis.candidacy, the one rule engine) --
SITE_CROSSES_PAGE = _code("site-crosses-page", _W, "the probed NOP crosses a 4 KiB page",
                          "a rewrite can move the probe into a detour that does not cross a "
                          "page", (_F, _V))
SITE_SEGMENT_PREFIX = _code("site-segment-prefix", _E, "a CS or DS prefix: not probeable",
                            "uprobes cannot be attached here on that generation; a nop10 "
                            "belongs behind a 1-byte nop (combo10, as usdt.h writes it), any "
                            "other site is best rewritten to the canonical nop5", (_F, _V))
SITE_HINT_NOP = _code("site-hint-nop", _W, "a hint NOP: single-stepped, not optimized",
                      "the kernel single-steps this NOP (about 15x slower than the int3 path); "
                      "rewrite it to the canonical nop5", (_F, _V))
SITE_ELF32 = _code("site-elf32", _I, "a 32-bit process: never optimized",
                   "only 64-bit processes get optimized uprobes", (_F, _S))
SITE_NOT_NOP5 = _code("site-not-nop5", _I, "not a 5-byte NOP the nop5 generation optimizes",
                      f"{_INT3_PATH}; `usdtpatch rewrite` can make room for a nop5", (_F, _V))
SITE_NOT_NOP10 = _code("site-not-nop10", _I, "not the 10-byte NOP the nop10 generation optimizes",
                       _INT3_PATH, (_F, _V))
NO_TRAMPOLINE_REACH = _code("no-trampoline-reach", _W,
                            "no trampoline page within +/-2 GiB of the site",
                            f"{_INT3_PATH}: a file or its neighbours span more than 2 GiB "
                            "around it", (_F, _S))
SITE_COMBO5_PC1 = _code("site-combo5-pc1", _I, "nop; nop5: optimized only when attached at pc+1",
                        "only libbpf 1.7+ attaches at pc + 1; a note rewrite that moves pc "
                        "onto the nop5 serves every tracer")

# -- patch windows (check), also why rewrite leaves a site as it is --
WINDOW_BRANCH_TARGET = _code("window-branch-target", _W,
                             "every window has a branch target inside it that cannot be "
                             "aimed at the detour", _BLOCK_HINT, (_F, _S))
WINDOW_CALL = _code("window-call", _W, "every window holds a call that cannot go along",
                    _BLOCK_HINT,
                    (_F, _S))
WINDOW_SYSCALL = _code("window-syscall", _W,
                       "every window holds a system-call instruction, which never moves",
                       _BLOCK_HINT, (_F, _S))
WINDOW_FAULT_OBSERVED = _code(
    "window-fault-observed", _W,
    "every window holds an instruction that can fault where the file's signal handler may "
    "recognise the fault by its pc", _BLOCK_HINT, (_F, _S))
WINDOW_FUNCTION_END = _code("window-function-end", _W,
                            "the function ends before 5 bytes can be covered", _BLOCK_HINT,
                            (_F, _S))
WINDOW_NO_PADDING = _code("window-no-padding", _W,
                          "the NOP run is too short and no padding follows", _BLOCK_HINT,
                          (_F, _S))
# -- the model (usdtpatch/elf/model.py): a construct outside it refuses the windows it reaches --
_MODEL_HINT = ("the site stays on the int3 path; report the construct (usdtpatch models what "
               "it knows can refer to code and refuses the rest)")
UNMODELLED_RELOCATION = _code("unmodelled-relocation", _W,
                              "a loader relocation table holds a type usdtpatch does not model",
                              _MODEL_HINT, (_F, _S))
UNMODELLED_DYNAMIC_TAG = _code("unmodelled-dynamic-tag", _W,
                               "the dynamic section holds a tag or flag bit usdtpatch does "
                               "not model", _MODEL_HINT, (_F, _S))
UNMODELLED_SECTION_TYPE = _code("unmodelled-section-type", _W,
                                "a section has a type or flag usdtpatch does not model",
                                _MODEL_HINT, (_F, _S))
UNMODELLED_SEGMENT_TYPE = _code("unmodelled-segment-type", _W,
                                "a program header has a type usdtpatch does not model",
                                _MODEL_HINT, (_F, _S))
UNMODELLED_NOTE = _code("unmodelled-note", _W,
                        "a note (owner, type) or GNU property usdtpatch does not model",
                        _MODEL_HINT, (_F, _S))
UNMODELLED_CFI = _code("unmodelled-cfi", _W,
                       "call frame information usdtpatch does not model (a CIE augmentation, "
                       "a pointer encoding, a call frame instruction)", _MODEL_HINT, (_F, _S))
UNMODELLED_LSDA_ENCODING = _code("unmodelled-lsda-encoding", _W,
                                 "an LSDA pointer encoding usdtpatch does not model",
                                 _MODEL_HINT, (_F, _S))
UNMODELLED_LINE_OPCODE = _code("unmodelled-line-opcode", _W,
                               "a .debug_line opcode (or unit version) usdtpatch does not "
                               "model", _MODEL_HINT, (_F, _S))
WINDOW_TEXT_RELOCATION = _code("window-text-relocation", _W,
                               "every window holds the place of a relocation the loader "
                               "applies (a text relocation)",
                               "the site stays on the int3 path; link without -z notext "
                               "(position-independent code needs no text relocation)",
                               (_F, _S))
WINDOW_ALL_TARGETS = _code("window-all-targets", _W,
                           "an unbounded or unrecognized computed jump: every boundary is a target",
                           _BLOCK_HINT, (_F, _S))
PROBE_NOT_DECODED = _code("probe-not-decoded", _W,
                          "the pc is not an instruction boundary", _BLOCK_HINT, (_F, _S))
PROBE_NOT_CODE = _code("probe-not-code", _W,
                       "the pc is data in code: a jump table, a constant island, padding",
                       "fix the note's pc; the site is left as it is", (_F, _S))
WINDOW_NO_FUNCTION_BOUNDS = _code("window-no-function-bounds", _W,
                                  "no FDE and no symbol covers the site", _BLOCK_HINT, (_F, _S))
SITE_IN_RSEQ_CS = _code("site-in-rseq-cs", _W, "the site is inside an rseq critical section",
                        "keep this probe untraced, or move it out of the critical section in "
                        "the source: code inside one is never moved", (_F, _S))
CFI_MALFORMED = _code("cfi-malformed", _W, "call frame information cannot be read",
                      "function bounds come from symbols only")

# -- hazards (check) --
RED_ZONE_LIVE = _code("red-zone-live", _E, "an optimized site in a function using its red zone",
                      "built with usdtpatch's sys/sdt.h, keep its red-zone guard on: it is "
                      "the default, off only with -DUSDTPATCH_REDZONE_GUARD=0; or build this "
                      "code with -mno-red-zone; or rewrite the site with usdtpatch's "
                      "red-zone-safe detour")
RED_ZONE_REWRITE = _code("red-zone-rewrite", _W,
                         "a site to rewrite in a function that may use its red zone",
                         "the rewrite must wrap the probe in lea -0x80(%rsp),%rsp / "
                         "lea 0x80(%rsp),%rsp")
ARG_USES_RSP = _code("arg-uses-rsp", _I, "an argument addressed through %rsp",
                     "the rewrite must add 128 to its displacement")
ARG_USES_RIP = _code("arg-uses-rip", _I, "a rip-relative argument of a site that moves",
                     "nothing to do: the rewrite keeps the note's operand as written; a "
                     "tracer reads the symbol's address, which does not depend on where the "
                     "probe is (a numeric rip-relative operand would: arg-rip-relative)")
PROCESS_CAN_FORK = _code("process-can-fork", _E, "the file can fork while sites are optimized",
                         "usdtpatch rewrite adds a fork guard (--fork-guard auto, the "
                         "default), and usdtpatch's sys/sdt.h builds one in "
                         "(USDTPATCH_FORK_GUARD); without one, keep these probes on the int3 "
                         "path in processes that fork", also=(_W,))
FORK_UNKNOWN = _code("fork-unknown", _W,
                     "no symbol names a fork and the code cannot tell whether it forks",
                     "rewrite (--fork-guard auto, the default) adds the fork guard where it "
                     "can cover these calls and refuses the file where it cannot "
                     "(fork-guard-unavailable); --fork-guard never takes the risk",
                     (_F,))
# fork-unknown's hint for a library that may fork through syscall(): what the guard covers
FORK_GUARDED = _code("fork-guarded", _I, "a forked child's optimized sites are re-armed",
                     "nothing to do: the fork guard puts the child's sites back on the int3 path")
DETOUR_SYMBOLS_LEFT_OUT = _code(
    "detour-symbols-left-out", _I, "the detours have no symbols in .symtab",
    "nothing to do: the detours work the same; debuggers and perf show them as addresses")
FORK_GUARD_FAILED = _code("fork-guard-failed", _E,
                          "the fork guard did not re-arm a forked child's sites",
                          "a bug of usdtpatch's fork guard: please report it with the file")
FORK_GUARD_UNAVAILABLE = _code("fork-guard-unavailable", _W,
                               "the fork guard cannot be added to this file",
                               "rewrite refuses it unless --fork-guard never; or keep its "
                               "probes on the int3 path in processes that fork")
SEMAPHORE_MISALIGNED = _code("semaphore-misaligned", _E, "the semaphore is not 2-byte aligned",
                             "the counter is an unsigned short; align it to 2 bytes")
SEMAPHORE_NOT_WRITABLE = _code("semaphore-not-writable", _E,
                               "the semaphore is in a read-only segment",
                               "the kernel cannot increment it: put it in a writable section")
SEMAPHORE_UNMAPPED = _code("semaphore-unmapped", _E, "the semaphore is in no loadable segment",
                           "the note's semaphore address is wrong; tracers cannot enable this "
                           "probe")
SEMAPHORE_NOT_IN_PROBES = _code("semaphore-not-in-probes", _W,
                                "the semaphore is not in .probes",
                                "bcc and perf look semaphores up through .probes")

# -- plan --
SITE_UNMAPPED = _code("site-unmapped", _E, "the site is in no loadable segment",
                      "nothing to plan for this probe", (_F, _V))
SITE_TRUNCATED = _code("site-truncated", _E, "the site's bytes end before the instruction does",
                       "nothing to plan for this probe")
OPTIMIZED_CALL_CLOBBERS_RED_ZONE = _code(
    "optimized-call-clobbers-red-zone", _W, "the optimized call writes below rsp on every hit",
    "safe only if the function keeps nothing live below rsp here; guard the site (rewrite "
    "--redzone-guard: lea -0x80(%rsp),%rsp around it) or build with -mno-red-zone")

# -- verify: findings, and the reasons it rejects a plan's sequences --
PLAN_FILE_MISMATCH = _code("plan-file-mismatch", _E, "the plan was made for another file",
                           "verify the plan against the file it was made for")
MACHINE_ERROR = _code("machine-error", _E, "the emulator cannot load the file",
                      "verify cannot run this file's sites (the message says why); list and "
                      "check still read it")
ADDRESS_MISMATCH = _code(
    "address-mismatch", _E,
    "the site's addresses do not add up",
    "make the plan again for this file and load base",
    _V)
ORIGINAL_MISMATCH = _code("original-mismatch", _E, "the plan's original bytes are not the file's",
                          "make the plan again for this file", _V)
SEQUENCE_START_MISMATCH = _code(
    "sequence-start-mismatch", _E,
    "a sequence does not start where the previous one ended",
    "the plan's sequences are inconsistent",
    _V)
STEP_INCONSISTENT = _code(
    "step-inconsistent", _E,
    "a step's before/after bytes do not match its write",
    "the plan's sequences are inconsistent",
    _V)
WRITE_OUTSIDE_SITE = _code(
    "write-outside-site", _E,
    "a write leaves the site",
    "the kernel writes only the site's bytes",
    _V)
KERNEL_CHECK_FAILS = _code(
    "kernel-check-fails", _E,
    "byte 0 is not what the kernel checks before the write",
    "the kernel would refuse this step",
    _V)
NO_INT3_FIRST = _code("no-int3-first", _E, "bytes other than byte 0 written without int3 first",
                      "write int3 at byte 0 first", _V)
DISPLACEMENT_WITHOUT_INT3 = _code(
    "displacement-without-int3", _E,
    "the displacement written while byte 0 is not int3",
    "write int3 at byte 0 first",
    _V)
WRITE_SPANS_BYTE0 = _code("write-spans-byte0", _E, "byte 0 written together with other bytes",
                          "write byte 0 alone", _V)
OPCODE_BEFORE_DISPLACEMENT = _code(
    "opcode-before-displacement", _E,
    "the opcode written before the displacement",
    "write the opcode last",
    _V)
OPTIMIZE_END_NOT_CALL = _code(
    "optimize-end-not-call", _E,
    "optimize does not end on the call to the trampoline",
    "the optimized form is `e8 rel32` (nop5) or `lea -0x80(%rsp),%rsp; call` (nop10)",
    _V)
WRONG_REL32 = _code(
    "wrong-rel32", _E,
    "the optimized call misses the trampoline",
    "rel32 = trampoline - (site + call length)",
    _V)
UNOPTIMIZE_LEAVES_CALL = _code("unoptimize-leaves-call", _E, "unoptimize leaves the call",
                               "unoptimize must end on the NOP", _V)
UNOPTIMIZE_END_NOT_NOP = _code("unoptimize-end-not-nop", _E,
                               "unoptimize does not end on the NOP", "restore the NOP", _V)
DETACH_END_NOT_ORIGINAL = _code(
    "detach-end-not-original", _E,
    "detach does not restore the original bytes",
    "restore the original bytes",
    _V)
TRAMPOLINE_OVERLAPS_FILE = _code(
    "trampoline-overlaps-file", _E,
    "the trampoline overlaps the file or is not page aligned",
    "choose a free page within reach",
    _V)
TOO_MANY_TORN_BYTES = _code(
    "too-many-torn-bytes", _E,
    "a step changes too many bytes to try every torn mixture",
    "split the write",
    _V)
TORN_STATE_FAULTS = _code(
    "torn-state-faults", _E,
    "a torn state faults",
    "the write order lets a CPU fetch a broken instruction",
    _V)
TORN_STATE_GOES_ASTRAY = _code("torn-state-goes-astray", _E,
                               "a torn state does not reach the site's exit", "as above", _V)
TORN_STATE_MOVES_RSP = _code("torn-state-moves-rsp", _E, "a torn state changes rsp", "as above", _V)
TORN_STATE_CLOBBERS_REGISTERS = _code("torn-state-clobbers-registers", _E,
                                      "a torn state changes registers or flags", "as above", _V)
TORN_STATE_DOUBLE_HIT = _code("torn-state-double-hit", _E, "a torn state hits the probe twice",
                              "as above", _V)
TORN_STATE_MISSES_HIT = _code("torn-state-misses-hit", _E,
                              "a torn state passes the probe unreported", "as above", _V)
HIT_REPORTS_WRONG_REGISTERS = _code("hit-reports-wrong-registers", _E,
                                    "a hit reports registers other than the site's", "as above", _V)
TORN_STATE_WRITES_MEMORY = _code("torn-state-writes-memory", _E,
                                 "a torn state writes at or above rsp", "as above", _V)
GUARDED_SITE_WRITES_RED_ZONE = _code(
    "guarded-site-writes-red-zone", _E,
    "a guarded site writes its red zone",
    "the guard must keep the red zone untouched",
    _V)
PARKED_THREAD_FAILS = _code(
    "parked-thread-fails", _E,
    "a thread parked in the trampoline fails during unoptimize",
    "unoptimize must keep the call's return path valid",
    _V)

# -- rewrite: findings, and why a site is left as it is --
DETOUR_WITHOUT_CFI = _code("detour-without-cfi", _I, "a detour without unwind information",
                           "debuggers cannot unwind from inside this detour")
MOVED_CALL_RETURN_ADDRESS = _code(
    "moved-call-return-address", _I,
    "a call moved into a detour: its callee sees a return address in the detour",
    "dladdr, backtrace_symbols and return-address range checks in the callee name the "
    "detour, not the caller; a build with a 5-byte NOP header keeps the original")
DETOUR_UNWIND_LEFT_OUT = _code(
    "detour-unwind-left-out", _W, "the detours get no unwind tables: no PT_GNU_EH_FRAME",
    "link with -Wl,--eh-frame-hdr (gcc leaves it out of static links) to give the detours "
    "unwind tables")
DETOUR_DWARF_LEFT_OUT = _code(
    "detour-dwarf-left-out", _I, "the detours get no DWARF: the input's cannot be extended",
    "nothing to do for the program; gdb shows the detours by their symbols, without lines")
DEBUG_FILE_STALE = _code(
    "debug-file-stale", _W,
    "the input's debug information is in a separate file, which describes the original code",
    "split the debug information from the rewritten file (objcopy --only-keep-debug OUTPUT), "
    "not before: gdb's break FILE:LINE can put an int3 inside a moved window")
FORM_CHOSEN = _code("form-chosen", _I, "the site form --form auto chose, and why",
                    "rewrite for another machine's kernel with --kernel nop5|nop10, "
                    "or name the form with --form")
KERNEL_OPTIMIZES_NOTHING = _code(
    "kernel-optimizes-nothing", _W,
    "the running kernel optimizes no uprobe: --form auto leaves the file as it is",
    "name the form (--form nop5|combo5|combo10) or the target kernel (--kernel nop5|nop10) "
    "to rewrite for another machine")
SITE_ALREADY_5_BYTE = _code(
    "site-already-5-byte", _I,
    "the site is already 5 bytes long",
    "nothing to do",
    _S)
NO_PATCH_WINDOW = _code("no-patch-window", _W, "no patch window", _BLOCK_HINT, _S)
WINDOW_OVERLAPS_SITE = _code(
    "window-overlaps-site", _W,
    "the window overlaps another rewritten site's",
    "the earlier site's detour carries this one when its window covers it",
    (_F, _S))
GUARD_IMPOSSIBLE = _code(
    "guard-impossible", _W,
    "the red-zone guard cannot re-express an argument",
    "build this code with -mno-red-zone",
    _S)
ARG_RIP_RELATIVE = _code(
    "arg-rip-relative", _W,
    "a numeric rip-relative argument would move",
    "rebuild with symbolic operands",
    _S)
WINDOW_WAY_IN = _code(
    "window-way-in", _W,
    "a branch into the window cannot be aimed at the detour's copy",
    "the site stays on the int3 path; a build with a 5-byte NOP header converts it",
    _S)
WINDOW_CALL_UNWIND = _code(
    "window-call-unwind", _W,
    "a call in the window needs exception tables the detour cannot get, and cannot be "
    "emulated",
    "the site stays on the int3 path; a build with a 5-byte NOP header converts it",
    (_F, _S))
WINDOW_EH_UNWIND = _code(
    "window-eh-unwind", _W,
    "an instruction in the window is covered by exception tables the detour cannot get",
    "the site stays on the int3 path; a build with a 5-byte NOP header converts it",
    (_F, _S))
WINDOW_LINE_ROW = _code(
    "window-line-row", _W,
    "a debugger's line row lies inside the window, and the file's line table cannot be "
    "written again",
    "the site stays on the int3 path; debug sections left uncompressed (no -gz) let the "
    "rewrite move the row",
    (_F, _S))
WINDOW_DEBUG_ENTRY = _code(
    "window-debug-entry", _W,
    "an inlined function's entry or a label of the DWARF lies inside the window",
    "the site stays on the int3 path; gdb's `break` on that function or label would stop "
    "inside the rewritten bytes",
    (_F, _S))
RELOCATION_FAILED = _code(
    "relocation-failed", _E,
    "the window's code cannot be relocated",
    "report it with the file; the site is left unchanged",
    _S)
VERIFICATION_FAILED = _code(
    "verification-failed", _E,
    "the detour is not equivalent to the original code",
    "report it with the file",
    _S)

# A rewrite with one of these skips has failed (exit 1).
REWRITE_FAILURES: frozenset[str] = frozenset(
    {RELOCATION_FAILED.code, VERIFICATION_FAILED.code})

# Codes an earlier version emitted for a cause that now has one code (plan files may hold
# them): old -> current.
RENAMED: Mapping[str, str] = MappingProxyType({
    "site-32-bit": SITE_ELF32.code,
    "site-unprobeable-prefix": SITE_SEGMENT_PREFIX.code,
    "no-trampoline": NO_TRAMPOLINE_REACH.code,
    "trampoline-out-of-reach": NO_TRAMPOLINE_REACH.code,
})

# Codes an earlier version emitted for a cause that is gone: a document that holds one is read
# without it. experimental-protocol: the nop10 protocol was a queued series, measured since.
RETIRED: frozenset[str] = frozenset({"experimental-protocol"})

CODES: Mapping[str, Code] = MappingProxyType(_REGISTRY)
