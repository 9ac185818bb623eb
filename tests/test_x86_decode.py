"""x86/decode.describe: the table of known NOP texts says what capstone says."""

from __future__ import annotations

import pytest

from usdtpatch.x86.decode import disassemble
from usdtpatch.x86.describe import _KNOWN_TEXT, describe
from usdtpatch.x86.nops import COMBO5, COMBO10, NOP1, NOP5, NOP10


@pytest.mark.parametrize("mode64", [True, False])
def test_every_known_text_is_capstones(mode64: bool) -> None:
    for enc, text in _KNOWN_TEXT[mode64].items():
        insns = disassemble(enc + b"\xcc" * 4, 0x401000, 1, mode64)
        assert insns and insns[0].size == len(enc)
        assert insns[0].text == text


@pytest.mark.parametrize("code", [NOP1, NOP5, NOP10, COMBO5, COMBO10, NOP1 + b"\x48\x89\xe5",
                                  NOP1 + b"\x0f\x1f\x44\x00", b"\x0f\x1f\x44\x00\x01",
                                  b"\xf3\x90", b"\x66\x90", b"\xc3"])
@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("mode64", [True, False])
def test_describe_agrees_with_capstone(code: bytes, count: int, mode64: bool) -> None:
    padded = code + b"\xcc" * 12
    insns = disassemble(padded, 0x1000, count, mode64)
    expected = "; ".join(i.text for i in insns) if insns else "(bad)"
    assert describe(padded, 0x1000, count, mode64) == expected
