"""Argument specs: every operand form of the note format, and forms that must stay unknown."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from usdtpatch.elf.args import (
    ImmOperand,
    MemOperand,
    RegOperand,
    UnknownOperand,
    parse_arg,
    parse_args,
    split_args,
)

CASES = [
    ("8@%rdi", 8, False, RegOperand("rdi")),
    ("-4@%eax", 4, True, RegOperand("eax")),
    ("1@%sil", 1, False, RegOperand("sil")),
    ("-2@$-5", 2, True, ImmOperand(-5)),
    ("4@$0x10", 4, False, ImmOperand(16)),
    ("8@$sym", 8, False, ImmOperand(0, "sym")),
    ("8@16(%rsp)", 8, False, MemOperand(16, None, "rsp", None, 1)),
    ("-4@-16(%rbp)", 4, True, MemOperand(-16, None, "rbp", None, 1)),
    ("8@sym(%rip)", 8, False, MemOperand(0, "sym", "rip", None, 1)),
    ("8@sym+8(%rip)", 8, False, MemOperand(8, "sym", "rip", None, 1)),
    ("8@sym-0x10(%rip)", 8, False, MemOperand(-16, "sym", "rip", None, 1)),
    # GCC writes a constant offset before the symbol too (PostgreSQL 15's checkpoint__done)
    ("-4@44+ckpt_stats(%rip)", 4, True, MemOperand(44, "ckpt_stats", "rip", None, 1)),
    ("8@-0x8+sym(%rip)", 8, False, MemOperand(-8, "sym", "rip", None, 1)),
    ("8@$12+sym", 8, False, ImmOperand(12, "sym")),
    ("8@16+counter", 8, False, MemOperand(16, "counter", None, None, 1)),
    ("4@(%rax,%rbx,4)", 4, False, MemOperand(0, None, "rax", "rbx", 4)),
    ("4@8(,%rcx,8)", 4, False, MemOperand(8, None, None, "rcx", 8)),
    ("4@(%rax,%rbx)", 4, False, MemOperand(0, None, "rax", "rbx", 1)),
    ("8@counter", 8, False, MemOperand(0, "counter", None, None, 1)),
    ("8@0x601040", 8, False, MemOperand(0x601040, None, None, None, 1)),
    ("8f@%xmm1", 8, False, RegOperand("xmm1")),
]


@pytest.mark.parametrize("raw,size,signed,operand", CASES, ids=[c[0] for c in CASES])
def test_operand_forms(raw: str, size: int, signed: bool, operand: object) -> None:
    arg = parse_arg(raw)
    assert (arg.raw, arg.size, arg.signed, arg.operand) == (raw, size, signed, operand)


def test_bare_register_of_old_notes() -> None:
    arg = parse_arg("%rdi")
    assert arg.size is None and arg.operand == RegOperand("rdi")


@pytest.mark.parametrize("raw", ["8@%fs:0x28", "8@%foo", "3@%rax", "8@(%rax,%rbx,3)",
                                 "8@()", "8@", "8@&x", "bar", "8@sym(%notareg)",
                                 "8@44-sym(%rip)", "8@44+(%rip)", "8@4+5(%rip)"],
                         ids=["segment", "bad-reg", "bad-size", "bad-scale", "empty-mem",
                              "empty", "junk", "no-size", "bad-base", "minus-symbol",
                              "plus-nothing", "two-numbers"])
def test_unknown_forms_are_kept_with_a_reason(raw: str) -> None:
    arg = parse_arg(raw)
    assert isinstance(arg.operand, UnknownOperand) and arg.operand.reason
    assert arg.raw == raw and arg.kind == "unknown"


@pytest.mark.parametrize("text,tokens", [("", []), (" ", []), ("8@%rdi", ["8@%rdi"]),
                                         ("8@%rdi  -4@%esi ", ["8@%rdi", "-4@%esi"])],
                         ids=["empty", "blank", "one", "extra-spaces"])
def test_split_plain(text: str, tokens: list[str]) -> None:
    assert split_args(text) == tokens
    assert [a.raw for a in parse_args(text)] == tokens


def test_split_keeps_bracketed_operands_whole() -> None:
    assert split_args("8@x0 -4@[sp, 12]  8@x1") == ["8@x0", "-4@[sp, 12]", "8@x1"]


def test_other_architectures_are_kept_as_text() -> None:
    args = parse_args("8@x0 -4@[sp, 12]", x86=False)
    assert [a.size for a in args] == [8, 4]
    assert all(isinstance(a.operand, UnknownOperand) for a in args)


@given(st.text(max_size=80))
def test_never_raises_and_keeps_every_token(text: str) -> None:
    args = parse_args(text)
    assert [a.raw for a in args] == split_args(text)
