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
from usdtpatch.elf.cfi import CfiError, CfiIndex, Lsda, eh_frame_unindexed, parse_lsda
from usdtpatch.elf.ehframe import LsdaRow, Personality, build_detour_lsda, personality_of
from usdtpatch.elf.image import ElfImage
from usdtpatch.elf.notes import GNU_PROPERTY_X86_FEATURE_1_SHSTK, x86_feature_1_and
from usdtpatch.errors import UnsupportedError

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


def call_technique(image: ElfImage, cfi: CfiIndex, win: PatchWindow, calls: str,
                    shstk: bool) -> tuple[str, frozenset[int], DetourEh | None] | str:
    """How the window's calls go along: (MOVED or EMULATED, the calls to emulate, what the
    detour's LSDA is built from), or why neither technique is sound here.

    Emulated wherever the window allows (`auto` and `emulate`: the call is the window's last
    instruction and the file does not mark shadow stacks), so that the callee sees its
    original return address (dladdr, backtrace_symbols, a caller-range check); moved
    otherwise, or always with `move`."""
    no_emulation = emulable(win)
    if shstk:
        no_emulation = ("the file marks shadow stacks (an emulated call's ret would not "
                        "match the shadow stack)")
    if calls != CALLS_MOVE and no_emulation is None:
        return EMULATED, frozenset(win.calls), None
    lost = detour_frames_lost(image, cfi, win)
    if lost is not None:
        return f"{lost}; the call cannot be emulated ({no_emulation or 'calls move'})"
    need = calls_unwind(image, cfi, win)
    if need is None:
        return MOVED, frozenset(), None
    eh = detour_eh(image, cfi, win)
    if not isinstance(eh, str):
        return MOVED, frozenset(), eh
    why = f"{need}; the detour's LSDA cannot be built ({eh})"
    if calls != CALLS_MOVE:
        why += f"; the call cannot be emulated ({no_emulation})"
    return why


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
        rows = [LsdaRow(c.start, c.end, c.landing_pad, c.action) for c in lsda.call_sites
                if c.start < win.end and win.start < c.end]
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
    fde = cfi.lookup(win.start)
    if fde is None or fde.lsda is None:
        return None
    try:
        lsda = parse_lsda(image, fde.lsda, fde.pc_begin)
    except CfiError as exc:
        return f"the function's LSDA at {fde.lsda:#x} does not parse: {exc}"
    calls = set(win.calls)
    for ins in win.insns:
        if ins.address not in calls:
            continue
        at = ins.end - 1  # the unwinder looks up the return address minus one
        entry = next((c for c in lsda.call_sites if c.start <= at < c.end), None)
        if entry is None:
            return (f"the call at {ins.address:#x} is left out of the function's call-site "
                    f"table (an exception there ends in std::terminate)")
        if entry.landing_pad is not None or entry.action:
            return (f"the call at {ins.address:#x} has a landing pad at "
                    f"{entry.landing_pad or 0:#x} in the function's LSDA")
    return None


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
