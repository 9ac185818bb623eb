"""The site forms a rewrite can emit, the red-zone guard, and the note argument fix-up.

Each form carries the NOP one kernel generation optimizes (usdtpatch.kernelfacts): nop5 and
combo5 the nop5 generation's, whose optimized call clobbers the 32 bytes below %rsp on every
hit; combo10 the nop10 generation's. docs/rewrite.md ("Site forms", "The red-zone guard") says
why each form and the guard look the way they do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from usdtpatch.elf.args import MemOperand, RegOperand, SdtArg
from usdtpatch.kernelfacts import RED_ZONE, Generation, generation_of_nop
from usdtpatch.x86.nops import (
    COMBO5,
    COMBO10,
    FORMS,
    GUARD_ENTER,
    GUARD_LEAVE,
    NOP5,
    FormFacts,
    SiteForm,
)


class Form(Enum):
    NOP5 = "nop5"  # note pc on the nop5
    COMBO5 = "combo5"  # 90 + nop5, note pc on the 90 (libbpf 1.7 attaches at pc + 1)
    COMBO10 = "combo10"  # 90 + 10-byte NOP (the nop10 generation; 7.3's libbpf at pc + 1)

    @property
    def bytes(self) -> bytes:
        return {Form.NOP5: NOP5, Form.COMBO5: COMBO5, Form.COMBO10: COMBO10}[self]

    @property
    def optimized_offset(self) -> int:
        """Offset of the instruction the kernel optimizes, from the note pc."""
        return 0 if self is Form.NOP5 else 1

    @property
    def optimized_length(self) -> int:
        return 10 if self is Form.COMBO10 else 5

    @property
    def kernel(self) -> Generation:
        """The kernel generation the form is written for: the one that optimizes its NOP."""
        gen = generation_of_nop(self.optimized_length)
        assert gen is not None, f"no generation optimizes the {self.value} form's NOP"
        return gen


def form_for(gen: Generation) -> Form:
    """The form a rewrite for `gen` writes (its row's auto_form); ValueError for a generation
    that optimizes nothing."""
    if gen.auto_form is None:
        raise ValueError(f"the {gen.name} generation optimizes no uprobe: no form is for it")
    return Form(gen.auto_form)


def kept_as_is(facts: FormFacts, form: Form) -> bool:
    """Whether a rewrite to `form` leaves a site of these facts as it is: one the target
    generation already optimizes (a 5-byte NOP site always; a 10-byte one for a nop10
    target). For a nop5 target a 10-byte site is rewritten like any NOP run."""
    return form.kernel.name in facts.kept_by


def left_as_is(site: SiteForm, form: Form) -> bool:
    """kept_as_is of a site form (rewriter/plan.py skips it; check calls it optimizable)."""
    return kept_as_is(FORMS[site], form)


class Guard(Enum):
    """The red-zone guard (`lea -128(%rsp),%rsp` ... `lea 128(%rsp),%rsp` around a site)."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


class ForkGuard(Enum):
    """The fork guard: code that restores the optimized sites in a forked child.

    auto: where the builder can add it and the file needs it; always: refuse a file it cannot
    cover; never: no guard.
    """

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class SiteBytes:
    """The bytes a site gets and where the note's pc goes within them."""

    code: bytes
    pc_offset: int
    guarded: bool

    @property
    def optimized_offset(self) -> int:
        """Offset of the NOP the kernel optimizes (nop5, or the nop10 of combo10)."""
        return self.pc_offset + (0 if self.code[self.pc_offset] != 0x90 else 1)


def site_bytes(form: Form, guarded: bool) -> SiteBytes:
    if guarded:
        return SiteBytes(GUARD_ENTER + form.bytes + GUARD_LEAVE, len(GUARD_ENTER), True)
    return SiteBytes(form.bytes, 0, False)


_SIZE_HEAD = re.compile(r"^(?P<head>-?\d+f?@)?(?P<operand>.*)$", re.DOTALL)
# disp(%rsp) or disp(%rsp,%index,scale): the guard moves rsp, not the index
_RSP_DISP = re.compile(r"^(?P<disp>-?(?:0[xX][0-9a-fA-F]+|\d+))?"
                       r"\(%rsp(?P<index>,%[a-z0-9]+(?:,[1248])?)?\)$")
_STACK_REGS = ("rsp", "esp", "sp", "spl")
_NAMES_STACK = re.compile(r"%(?:rsp|esp|sp|spl)\b")


def guard_args(args: tuple[SdtArg, ...]) -> tuple[str, str | None]:
    """The argument string for a guarded site (every `disp(%rsp)` and `disp(%rsp,%i,s)` gets
    disp + 128, whatever the argument's size: `24@8(%rsp)` too), or the reason there is none
    (an argument that is %rsp itself, indexes with it, or names it in a form not rewritten).
    The operand text is read from each argument's raw spec, so an operand the parser keeps as
    unknown (a size the note format does not fix) moves with the others or refuses the
    guard."""
    out: list[str] = []
    for a in args:
        op = a.operand
        m = _SIZE_HEAD.match(a.raw)
        head, text = (m["head"] or "", m["operand"]) if m else ("", a.raw)
        if isinstance(op, RegOperand) and op.reg in _STACK_REGS:
            return "", f"argument {a.raw!r} is the stack pointer itself"
        if isinstance(op, MemOperand) and op.index == "rsp":
            return "", f"argument {a.raw!r} indexes with the stack pointer"
        if _NAMES_STACK.search(text) is None:
            out.append(a.raw)
            continue
        d = _RSP_DISP.match(text.strip())
        if d is None:
            return "", f"argument {a.raw!r} addresses the stack in a form not rewritten"
        disp = int(d["disp"], 0) if d["disp"] else 0
        out.append(f"{head}{disp + RED_ZONE}(%rsp{d['index'] or ''})")
    return " ".join(out), None


def uses_numeric_rip(args: tuple[SdtArg, ...]) -> str | None:
    """An argument read relative to rip with a number (no symbol) moves with the site."""
    for a in args:
        op = a.operand
        if isinstance(op, MemOperand) and op.base == "rip" and op.symbol is None:
            return a.raw
    return None
