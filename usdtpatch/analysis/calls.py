"""How the calls inside a patch window go along into a detour: moved (they return into the
detour, which gets its own FDE and, where the function's LSDA covers them, its own LSDA) or
emulated (the original return address pushed, then a jmp), or why neither is sound
(docs/rewrite.md, "Windows that hold a call").

Decided here, below both `check` and the rewrite's plan, so that both make the one decision
(usdtpatch.analysis.check predicts what usdtpatch.rewriter.plan does).
"""

from __future__ import annotations

from dataclasses import dataclass

from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.elf.cfi import (
    CallSite,
    CfiError,
    CfiIndex,
    Lsda,
    eh_frame_unindexed,
    parse_lsda,
)
from usdtpatch.elf.ehframe import LsdaRow, Personality, build_detour_lsda, personality_of
from usdtpatch.elf.image import ElfImage
from usdtpatch.elf.notes import GNU_PROPERTY_X86_FEATURE_1_SHSTK, x86_feature_1_and
from usdtpatch.errors import UnsupportedError
from usdtpatch.findings import WINDOW_CALL_UNWIND, WINDOW_EH_UNWIND
from usdtpatch.x86.decode import CodeInsn

# How the calls of a window are handled (plan_rewrite's `calls`, SiteDecision.calls).
# auto: emulate where the window allows (the callee sees its original return address), else
# move (the callee sees the detour's: `moved-call-return-address` says so)
CALLS_AUTO = "auto"
CALLS_MOVE = "move"  # always move (skip where the detour's LSDA cannot be built)
CALLS_EMULATE = "emulate"  # emulate where possible (never in a SHSTK-marked file), else move
CALL_CHOICES = (CALLS_AUTO, CALLS_MOVE, CALLS_EMULATE)
MOVED = "moved"
EMULATED = "emulated"


@dataclass(frozen=True, slots=True)
class DetourEh:
    """What a detour that moves calls needs for exceptions: the function's LSDA and
    personality (the detour gets its own LSDA, built from them)."""

    lsda: Lsda
    personality: Personality


def shadow_stack_marked(image: ElfImage) -> bool:
    """Whether `.note.gnu.property` marks the file as shadow-stack compatible (x86 feature
    SHSTK): its process may run with a user-space shadow stack, where a `ret` must match a
    `call`."""
    sec = image.section(".note.gnu.property")
    if sec is None:
        return False
    bits = x86_feature_1_and(bytes(image.section_data(sec)), image.is64)
    return bool(bits is not None and bits & GNU_PROPERTY_X86_FEATURE_1_SHSTK)


def emulable(win: PatchWindow) -> str | None:
    """Why the window's calls cannot be emulated (None: they can)."""
    if len(win.calls) != 1:
        return f"the window holds {len(win.calls)} calls"
    last = win.insns[-1] if win.insns else None
    if last is None or last.address != win.calls[0] or last.end != win.end:
        return "its call is not the window's last instruction"
    return None


@dataclass(frozen=True, slots=True)
class Handling:
    """What a detour of the window needs for its calls and exceptions: the call technique
    (MOVED, EMULATED; None without a call), the calls emulated, and what the detour's own
    LSDA is built from (None: it needs none)."""

    technique: str | None
    emulate: frozenset[int]
    eh: DetourEh | None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the window cannot move to a detour: its finding code and reason."""

    code: str
    reason: str


def detour_handling(image: ElfImage, cfi: CfiIndex, win: PatchWindow, calls: str,
                    shstk: bool) -> Handling | Refusal:
    """What a detour of the window needs for its calls (`call_technique`) and for an
    exception thrown from a signal at one of its instructions (`faults_unwind`), or why it
    cannot have it: the one decision check and the rewrite's plan ask for every window that
    moves."""
    if not win.calls:
        return _with_fault_tables(image, cfi, win, None, frozenset())
    return call_technique(image, cfi, win, calls, shstk)


def call_technique(image: ElfImage, cfi: CfiIndex, win: PatchWindow, calls: str,
                   shstk: bool) -> Handling | Refusal:
    """How the window's calls go along (MOVED or EMULATED, the calls to emulate, what the
    detour's LSDA is built from), or why neither technique is sound here.

    Emulated wherever the window allows (`auto` and `emulate`: the call is the window's last
    instruction and the file does not mark shadow stacks), so that the callee sees its
    original return address (dladdr, backtrace_symbols, a caller-range check); moved
    otherwise, or always with `move`."""
    no_emulation = emulable(win)
    if shstk:
        no_emulation = ("the file marks shadow stacks (an emulated call's ret would not "
                        "match the shadow stack)")
    every = frozenset(win.calls)
    if calls != CALLS_MOVE and no_emulation is None:
        return _with_fault_tables(image, cfi, win, EMULATED, every)
    lost = detour_frames_lost(image, cfi, win)
    if lost is not None:
        return Refusal(WINDOW_CALL_UNWIND.code,
                       f"{lost}; the call cannot be emulated ({no_emulation or 'calls move'})")
    need = calls_unwind(image, cfi, win)
    if need is None:
        return _with_fault_tables(image, cfi, win, MOVED, frozenset())
    eh = detour_eh(image, cfi, win)
    if not isinstance(eh, str):
        return Handling(MOVED, frozenset(), eh)
    why = f"{need}; the detour's LSDA cannot be built ({eh})"
    if calls != CALLS_MOVE:
        why += f"; the call cannot be emulated ({no_emulation})"
    return Refusal(WINDOW_CALL_UNWIND.code, why)


def _with_fault_tables(image: ElfImage, cfi: CfiIndex, win: PatchWindow,
                       technique: str | None, emulate: frozenset[int]) -> Handling | Refusal:
    """The technique, with the detour's own LSDA where an exception thrown from a signal at
    one of the window's instructions needs it (`faults_unwind`); `window-eh-unwind` where
    it needs it and the detour cannot get it."""
    need = faults_unwind(image, cfi, win)
    if need is None:
        lost = _fault_frames_lost(image, cfi, win)
        if lost is not None:
            return Refusal(WINDOW_EH_UNWIND.code, lost)
        return Handling(technique, emulate, None)
    if cfi.lookup(win.start) is not None and eh_frame_unindexed(image) is not None:
        return Refusal(WINDOW_EH_UNWIND.code,
                       f"{need}; the file has no PT_GNU_EH_FRAME header, so the detour would "
                       f"get no FDE and no LSDA")
    eh = detour_eh(image, cfi, win)
    if isinstance(eh, str):
        return Refusal(WINDOW_EH_UNWIND.code, f"{need}; the detour's LSDA cannot be built ({eh})")
    return Handling(technique, emulate, eh)


def _fault_frames_lost(image: ElfImage, cfi: CfiIndex, win: PatchWindow) -> str | None:
    """Why an exception thrown from a signal at one of the window's instructions could not
    unwind through the detour, where the original frame can: the detour gets no FDE (as
    `detour_frames_lost` says for calls) and the file links the C++ runtime, so a handler
    may throw through the faulting frame to a caller (-fnon-call-exceptions code; the fuzz
    campaign's pair 1-1948, a gcc static link, ended in std::terminate). None otherwise."""
    # the C++ runtime linked in (its exception's type name, in a stripped file too): a static
    # C program carries glibc's and libgcc's exception tables but throws nothing
    if detour_frames_lost(image, cfi, win) is None or b"St9exception\0" not in image.data:
        return None
    for ins in win.insns:
        if may_fault(ins):
            return (f"the instruction at {ins.address:#x} can fault and the file links the C++ "
                    f"runtime: an exception thrown from a signal there unwinds "
                    f"through its frame, and the file has no PT_GNU_EH_FRAME header, so the "
                    f"detour would get no FDE")
    return None


def detour_frames_lost(image: ElfImage, cfi: CfiIndex, win: PatchWindow) -> str | None:
    """Why a call moved into a detour could not be unwound through, where the original
    can (None: it can, or the original cannot either): the file's `.eh_frame` has no
    PT_GNU_EH_FRAME header (every gcc static link), so the detour's FDE is not written
    (analysis.hazards' `detour-unwind-left-out`) and an exception or a backtrace from the
    callee stops at the detour (an exception then ends in std::terminate)."""
    if cfi.lookup(win.start) is None or eh_frame_unindexed(image) is None:
        return None
    return ("the file has no PT_GNU_EH_FRAME header, so the detour would get no FDE and an "
            "exception or a backtrace from the moved call would stop in it")


def detour_eh(image: ElfImage, cfi: CfiIndex, win: PatchWindow) -> DetourEh | str:
    """The function's LSDA and personality, checked by building an LSDA from them, or why
    a detour cannot get one."""
    fde = cfi.lookup(win.start)
    if fde is None or fde.lsda is None:
        return "no LSDA"
    try:
        lsda = parse_lsda(image, fde.lsda, fde.pc_begin)
        personality = personality_of(image, fde.cie)
        rows = [LsdaRow(max(c.start, win.start), min(c.end, win.end), c.landing_pad, c.action)
                for c in lsda.call_sites if c.start < win.end and win.start < c.end]
        build_detour_lsda(image, lsda, win.start, win.start, rows)  # a trial at the window
    except (CfiError, UnsupportedError) as exc:
        return str(exc)
    return DetourEh(lsda, personality)


def calls_unwind(image: ElfImage, cfi: CfiIndex, win: PatchWindow) -> str | None:
    """Why the window's calls cannot be moved into a detour whose FDE has no LSDA, or None.

    An exception thrown by a moved call unwinds through the detour's FDE, which names no
    personality: unwinding goes on to the caller. That is what the original does when its
    function has no LSDA, or when the call's call-site entry has no landing pad and no action;
    a call with a landing pad (a catch, a destructor), or one the table leaves out (which ends
    in std::terminate, as in a noexcept function), would behave differently.
    """
    lsda = _function_lsda(image, cfi, win)
    if not isinstance(lsda, Lsda):
        return lsda
    calls = set(win.calls)
    for ins in win.insns:
        if ins.address not in calls:
            continue
        entry = call_site_at(lsda, ins.end - 1)  # the return address minus one
        if entry is None:
            return (f"the call at {ins.address:#x} is left out of the function's call-site "
                    f"table (an exception there ends in std::terminate)")
        if entry.landing_pad is not None or entry.action:
            return (f"the call at {ins.address:#x} has a landing pad at "
                    f"{entry.landing_pad or 0:#x} in the function's LSDA")
    return None


def _function_lsda(image: ElfImage, cfi: CfiIndex, win: PatchWindow) -> Lsda | str | None:
    """The LSDA of the window's function, None where it has none, or why it does not parse."""
    fde = cfi.lookup(win.start)
    if fde is None or fde.lsda is None:
        return None
    try:
        return parse_lsda(image, fde.lsda, fde.pc_begin)
    except CfiError as exc:
        return f"the function's LSDA at {fde.lsda:#x} does not parse: {exc}"


def call_site_at(lsda: Lsda, at: int) -> CallSite | None:
    """The call-site entry of `lsda` covering `at`, or None (the table leaves it out: an
    exception there ends in std::terminate)."""
    return next((c for c in lsda.call_sites if c.start <= at < c.end), None)


def faults_unwind(image: ElfImage, cfi: CfiIndex, win: PatchWindow) -> str | None:
    """Why the window's instructions need the detour's own LSDA for an exception thrown from
    a signal at one of them, or None.

    A signal frame's pc is looked up as it is (not minus one): a fault at an instruction
    (code built with -fnon-call-exceptions, whose SIGSEGV handler throws) is looked up in the
    function's call-site table at the instruction's own address. Run from a detour whose FDE
    names no LSDA, the exception goes on to the caller; that is what the original does only
    where the entry covering the instruction has no landing pad and no action. An entry with
    one reaches a handler, and an instruction the table leaves out ends in std::terminate:
    both need the detour's own table, which repeats the original's row of each instruction.
    Only an instruction that can fault is looked up so (`may_fault`): a throw from a signal
    delivered at any other pc is not something C++ defines (gcc covers only the trapping
    instructions of -fnon-call-exceptions code, and leaves the others out of its tables).
    """
    lsda = _function_lsda(image, cfi, win)
    if not isinstance(lsda, Lsda):
        return lsda
    for ins in win.insns:
        if not may_fault(ins):
            continue
        entry = call_site_at(lsda, ins.address)
        if entry is None:
            return (f"the instruction at {ins.address:#x} is left out of the function's "
                    f"call-site table (an exception thrown from a signal there ends in "
                    f"std::terminate)")
        if entry.landing_pad is not None or entry.action:
            return (f"the instruction at {ins.address:#x} has a landing pad at "
                    f"{entry.landing_pad or 0:#x} in the function's LSDA (an exception "
                    f"thrown from a signal there lands there)")
    return None


# instructions that fault without touching memory: division, and the ones made to trap
_FAULTING = ("div", "idiv", "ud", "int", "into", "hlt", "bound", "syscall", "sysenter")


def may_fault(ins: CodeInsn) -> bool:
    """Whether the instruction can raise a synchronous signal whose handler a C++ program
    could throw from (what gcc's -fnon-call-exceptions covers): an explicit memory operand
    (not `lea`, not a NOP's), a division, a trap. Stack pushes and pops, calls and returns
    are not counted, as gcc does not count them."""
    name = ins.base_mnemonic or ins.mnemonic
    if name.startswith(("nop", "lea", "endbr", "prefetch")):
        return False
    return ins.mem is not None or name.startswith(_FAULTING)


def return_addresses(win: PatchWindow, technique: str | None,
                     moved_to: dict[int, int] | None = None) -> list[tuple[int, int, int | None]]:
    """(call, original return address, what its callee sees: the original for an emulated
    call, the detour's copy of the return address for a moved one, None where the detour is
    not laid out yet) of every call of the window."""
    out: list[tuple[int, int, int | None]] = []
    for ins in win.insns:
        if ins.address in win.calls:
            seen = ins.end if technique == EMULATED else (
                moved_to.get(ins.end) if moved_to is not None else None)
            out.append((ins.address, ins.end, seen))
    return out
