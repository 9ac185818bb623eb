"""The detours a rewrite builds, recorded, and their mutants: what the prover's tests feed it.

`questions(path)` runs the planner with a verifier that accepts everything and records each
question (the window, the detour, the probes, the ways in): the detours exactly as the
rewriter builds them (guards, moved and emulated calls, adjacent probes). `mutants(q)`
gives every mutant of one detour that keeps its length: a branch or rip-relative field +1
and -1 (a wrong jump back, a wrong call target, an emulated call's wrong return address), a
flipped condition, an instruction dropped (NOPs in its place), two neighbours swapped, and a
guard without its restore (`lea 0x80(%rsp),%rsp` turned into a NOP).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from usdtpatch.analysis.forms import Form, Guard
from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.elf.image import ElfImage, parse_elf
from usdtpatch.io import read_input
from usdtpatch.rewriter.plan import plan_rewrite
from usdtpatch.x86.decode import sweep
from usdtpatch.x86.nops import GUARD_LEAVE
from usdtpatch.x86.relocate import Detour

NOP8 = bytes.fromhex("0f1f840000000000")


@dataclass(frozen=True)
class Question:
    """One detour as the planner asked about it."""

    image: ElfImage
    window: PatchWindow
    detour: Detour
    probes: tuple[int, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def code(self) -> bytes:
        return bytes(self.image.read_vaddr(self.window.start, self.window.size))

    def with_code(self, code: bytes) -> Question:
        d = self.detour
        return Question(self.image, self.window,
                        Detour(d.address, code, d.probe_address, d.site_length, d.insn_map),
                        self.probes, self.extra)


def questions(path: str, guard: Guard = Guard.AUTO, calls: str = "auto") -> list[Question]:
    """Every detour the planner verifies for `path` (form nop5)."""
    image = parse_elf(read_input(path))
    out: list[Question] = []

    def record(image: ElfImage, window: PatchWindow, detour: Detour, probes: tuple[int, ...],
               **extra: Any) -> None:
        out.append(Question(image, window, detour, probes, extra))

    plan_rewrite(image, form=Form.NOP5, guard=guard, verify=record, calls=calls)
    return out


def _field(raw: bytes, rel: int) -> tuple[int, int] | None:
    for width in (4, 1):
        if -(1 << (8 * width - 1)) <= rel < 1 << (8 * width - 1):
            f = rel.to_bytes(width, "little", signed=True)
            if raw.count(f) == 1:
                return raw.index(f), width
    return None


def mutants(q: Question) -> Iterator[tuple[str, Question]]:
    """(what, the mutated question) for every mutant of q's detour."""
    d = q.detour
    code = d.code
    insns = sweep(code, d.address).insns
    site = range(d.probe_address, d.probe_address + d.site_length)
    body = [i for i in insns if i.address not in site and i is not insns[-1]]
    for ins in insns:
        off = ins.address - d.address
        raw = code[off : off + ins.size]
        target = ins.target if ins.target is not None else ins.rip_target
        if target is not None:
            cut = _field(raw, target - ins.end)
            if cut is not None:
                at, width = cut
                for delta in (1, -1):
                    new = (target - ins.end + delta).to_bytes(width, "little", signed=True)
                    yield (f"{ins.text} field {delta:+d}",
                           q.with_code(code[:off] + raw[:at] + new + raw[at + width:]
                                       + code[off + ins.size:]))
        j = 1 if raw[:1] == b"\x0f" else 0
        if (j == 0 and 0x70 <= raw[0] <= 0x7F) or (j == 1 and 0x80 <= raw[1] <= 0x8F):
            flipped = raw[:j] + bytes([raw[j] ^ 1]) + raw[j + 1:]
            yield f"{ins.text} flipped", q.with_code(code[:off] + flipped +
                                                     code[off + ins.size:])
    for ins in body:
        off = ins.address - d.address
        yield f"{ins.text} dropped", q.with_code(code[:off] + b"\x90" * ins.size +
                                                 code[off + ins.size:])
    for a, b in pairwise(body):
        if a.end != b.address:
            continue
        off = a.address - d.address
        swapped = code[b.address - d.address : b.end - d.address] + \
            code[off : a.end - d.address]
        yield (f"{a.text} / {b.text} swapped",
               q.with_code(code[:off] + swapped + code[b.end - d.address:]))
    at = code.find(GUARD_LEAVE)
    if at >= 0:
        yield "guard without its restore", q.with_code(code[:at] + NOP8 +
                                                       code[at + len(GUARD_LEAVE):])
