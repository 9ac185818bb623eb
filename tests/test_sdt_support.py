"""Helpers shared by the sdt_headers tests (building fixtures, comparing notes), and the tests
of those helpers: the note comparator and the readelf parser must reject what differs.

The fixture sources are under tests/data/sdt/; usdtpatch's header is sdt_headers/sys/sdt.h and
systemtap's is the system one (Debian systemtap-sdt-dev). A build "with ours" puts
`-I sdt_headers` first on the include path, exactly as a project would switch.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from usdtpatch.analysis.probes import Probe, ProbeSet
from usdtpatch.api import load
from usdtpatch.elf.args import MemOperand, RegOperand
from usdtpatch.elf.image import ET_REL

ROOT = Path(__file__).resolve().parent.parent
SDT_INCLUDE = ROOT / "sdt_headers"
DATA = Path(__file__).resolve().parent / "data" / "sdt"


def have(*tools: str) -> bool:
    return all(shutil.which(t) for t in tools)


def system_sdt_h() -> Path | None:
    """systemtap's header, where the compilers find <sys/sdt.h> without our -I."""
    for d in ("/usr/include", "/usr/include/x86_64-linux-gnu"):
        p = Path(d) / "sys" / "sdt.h"
        if p.is_file():
            return p
    return None


def need_toolchain(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")
    if system_sdt_h() is None:
        pytest.skip("systemtap's sys/sdt.h is not installed (Debian systemtap-sdt-dev)")


class BuildError(Exception):
    pass


def run_cc(cmd: list[str], cwd: Path | None = None) -> None:
    """Run one compiler command; a failure raises BuildError with the command and stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    if proc.returncode != 0:
        err = proc.stderr if len(proc.stderr) <= 6000 else \
            f"{proc.stderr[:2000]}\n[...]\n{proc.stderr[-4000:]}"
        raise BuildError(f"{' '.join(cmd)}\n{err}")


@dataclass(frozen=True, slots=True)
class NoteView:
    """One note as compared between builds: every field but pc."""

    provider: str
    name: str
    base: int
    semaphore: int
    args: str


def note_views(ps: ProbeSet) -> list[NoteView]:
    return [NoteView(p.provider, p.name, p.note.base, p.note.semaphore, p.note.args)
            for p in ps.probes]


def _fields_differ(theirs: ProbeSet, ours: ProbeSet, pa: Probe, pb: Probe, where: str
                   ) -> list[str]:
    """The differences of two notes' provider and name, and of what their base and semaphore
    point at (the addresses themselves move with the code)."""
    out: list[str] = []
    for field in ("provider", "name"):
        va, vb = getattr(pa.note, field), getattr(pb.note, field)
        if va != vb:
            out.append(f"{where}: {field} {va!r} != {vb!r}")
    for field in ("base", "semaphore"):
        va, vb = getattr(pa.note, field), getattr(pb.note, field)
        wa, wb = _pointee(theirs, va), _pointee(ours, vb)
        if wa != wb:
            out.append(f"{where}: {field} {va:#x} ({wa}) != {vb:#x} ({wb})")
    return out


def _compare(theirs: ProbeSet, ours: ProbeSet,
             args_differ: Callable[[ProbeSet, Probe, Probe, str], list[str]]) -> list[str]:
    """The differences of two builds' notes, pair by pair in order: the count, each pair's
    fields (_fields_differ) and its arguments (`args_differ(ours, theirs's, ours's, where)`)."""
    a, b = theirs.probes, ours.probes
    out: list[str] = []
    if len(a) != len(b):
        out.append(f"{len(a)} notes in systemtap's build, {len(b)} in ours")
    for i, (pa, pb) in enumerate(zip(a, b, strict=False)):
        where = f"note {i} ({pa.probe_id})"
        out += _fields_differ(theirs, ours, pa, pb, where)
        out += args_differ(ours, pa, pb, where)
    return out


def compare_notes(theirs: ProbeSet, ours: ProbeSet, registers_may_differ: bool = False
                  ) -> list[str]:
    """Differences between two builds' notes, field by field except pc (empty: equal).

    With `registers_may_differ`, an argument that is a register in both builds may name a
    different register (size, sign and float flag must still agree, and every other operand
    must be equal): see test_sdt_notes for when that is allowed and why.
    """
    return _compare(theirs, ours, lambda _ps, pa, pb, where:
                    _args_differ(pa, pb, where, registers_may_differ))


def _args_differ(pa: Probe, pb: Probe, where: str, registers_may_differ: bool) -> list[str]:
    if pa.note.args == pb.note.args:
        return []
    if not registers_may_differ or len(pa.args) != len(pb.args):
        return [f"{where}: args {pa.note.args!r} != {pb.note.args!r}"]
    out: list[str] = []
    for j, (x, y) in enumerate(zip(pa.args, pb.args, strict=True)):
        if (x.size, x.signed, x.is_float) != (y.size, y.signed, y.is_float):
            out.append(f"{where}: arg {j} {x.raw!r} != {y.raw!r}")
        elif isinstance(x.operand, RegOperand) and isinstance(y.operand, RegOperand):
            continue
        elif x.operand != y.operand:
            out.append(f"{where}: arg {j} {x.raw!r} != {y.raw!r}")
    return out


def compare_notes_guarded(theirs: ProbeSet, ours: ProbeSet) -> list[str]:
    """Differences between systemtap's build and a guarded build of ours (the default): the
    notes agree field by field (provider, name, base, semaphore, and each argument's size,
    sign and float flag), but a guarded site's arguments are registers or immediates, never
    memory (the "nr" constraint): where systemtap's names memory, ours names a register
    holding the same value, and an immediate must be the same immediate. A probe whose
    arguments do not all fit a register is not guarded (systemtap's nop and operands), nor
    is a probe of an assembler file (its operands are hand-written text):
    its site is a 1-byte nop and its operands are systemtap's, but for which register or
    stack slot the compiler chose: the guarded probes around it keep their values in
    registers, so the function's registers and stack slots may be allocated differently
    (a register for a register; the same base register, another displacement, for a stack
    slot; seen with g++ -O3 and clang -O0)."""
    return _compare(theirs, ours, _guarded_args_differ)


def _guarded_args_differ(ours: ProbeSet, pa: Probe, pb: Probe, where: str) -> list[str]:
    from usdtpatch.elf.args import ImmOperand

    if len(pa.args) != len(pb.args):
        return [f"{where}: args {pa.note.args!r} != {pb.note.args!r}"]
    fallback = not _guarded(ours, pb)
    out: list[str] = []
    for j, (x, y) in enumerate(zip(pa.args, pb.args, strict=True)):
        if (x.size, x.signed, x.is_float) != (y.size, y.signed, y.is_float):
            out.append(f"{where}: arg {j} {x.raw!r} != {y.raw!r}")
        elif fallback:
            if x.operand != y.operand and not _same_stack_slot_kind(x.operand, y.operand):
                out.append(f"{where}: unguarded fallback arg {j} {x.raw!r} != {y.raw!r}")
        elif isinstance(y.operand, MemOperand):
            out.append(f"{where}: arg {j} {y.raw!r} is memory at a guarded site")
        elif isinstance(x.operand, ImmOperand) and x.operand != y.operand:
            out.append(f"{where}: arg {j} {x.raw!r} != {y.raw!r}")
        elif not isinstance(y.operand, (RegOperand, ImmOperand)):
            out.append(f"{where}: arg {j} {y.raw!r} is not a register or immediate")
    return out


GUARD_IN = bytes([0x48, 0x8D, 0x64, 0x24, 0x80])  # lea -0x80(%rsp),%rsp


def _guarded(ps: ProbeSet, p: Probe) -> bool:
    """Whether the red-zone guard's `lea -0x80(%rsp),%rsp` is right before the site (for a
    set without an image, as the comparator's own tests make: whether the site is not a
    1-byte nop)."""
    if ps.image is None:
        return p.code[:1] != b"\x90"
    return bool(ps.image.read_vaddr(p.address - len(GUARD_IN), len(GUARD_IN)) == GUARD_IN)


def _same_stack_slot_kind(x: object, y: object) -> bool:
    """Two registers, or two stack slots off the same base register: the same kind of
    location, which the compiler may have chosen differently."""
    if isinstance(x, RegOperand) and isinstance(y, RegOperand):
        return True
    return (isinstance(x, MemOperand) and isinstance(y, MemOperand) and x.base == y.base
            and x.base in ("rsp", "rbp") and (x.index, x.scale, x.symbol)
            == (y.index, y.scale, y.symbol))


def _pointee(ps: ProbeSet, addr: int) -> str:
    """What a note's base or semaphore points at, independent of the layout: the allocated
    section holding it and the offset within (the raw address in an object file, where every
    section starts at 0, and for a set without an image). Linked builds with usdtpatch's
    header carry the fork guard's code and table, so the same section may sit elsewhere."""
    image = ps.image
    if image is None or image.type == ET_REL or addr == 0:
        return f"{addr:#x}"
    sec = image.section_for_vaddr(addr)
    return f"{addr:#x}" if sec is None else f"{sec.name}+{addr - sec.addr:#x}"


def rsp_relative(ps: ProbeSet) -> list[str]:
    """Every argument of every probe that addresses memory through %rsp."""
    return [f"{p.probe_id}: {a.raw}" for p in ps.probes for a in p.args
            if isinstance(a.operand, MemOperand) and "rsp" in (a.operand.base, a.operand.index)]


_READELF_NOTE = re.compile(
    r"\s+Provider: (?P<provider>.*)\n\s+Name: (?P<name>.*)\n"
    r"\s+Location: (?P<pc>0x[0-9a-f]+), Base: (?P<base>0x[0-9a-f]+), "
    r"Semaphore: (?P<semaphore>0x[0-9a-f]+)\n\s+Arguments: ?(?P<args>.*)$", re.MULTILINE)
# (readelf -W puts "Provider:" on the note's header line, after a tab: accepted too.)


def parse_readelf_notes(text: str) -> list[dict[str, str | int]]:
    """The stapsdt notes in `readelf -n` output, as dicts (pc, base, semaphore as ints)."""
    out: list[dict[str, str | int]] = []
    for m in _READELF_NOTE.finditer(text):
        out.append({"provider": m["provider"], "name": m["name"], "pc": int(m["pc"], 16),
                    "base": int(m["base"], 16), "semaphore": int(m["semaphore"], 16),
                    "args": m["args"].rstrip()})
    return out


def readelf_notes(path: Path) -> list[dict[str, str | int]]:
    proc = subprocess.run(["readelf", "-n", "-W", str(path)], capture_output=True, text=True,
                          check=True)
    return parse_readelf_notes(proc.stdout)


def readelf_without_pc(notes: list[dict[str, str | int]]) -> list[dict[str, str | int]]:
    """The notes without their addresses (pc, and base and semaphore, which move with the
    layout: compare_notes compares what those point at)."""
    return [{k: v for k, v in n.items() if k not in ("pc", "base", "semaphore")}
            for n in notes]


def load_probes(path: Path) -> ProbeSet:
    return load(str(path))


# --- tests of the helpers: they must reject what differs ---------------------------------

_READELF_SAMPLE = """
Displaying notes found in: .note.stapsdt
  Owner                Data size 	Description
  stapsdt              0x0000003a	NT_STAPSDT (SystemTap probe descriptors)
    Provider: fix
    Name: args2
    Location: 0x0000000000001221, Base: 0x0000000000002034, Semaphore: 0x0000000000000000
    Arguments: -4@%eax -8@%rsi
  stapsdt              0x00000030	NT_STAPSDT (SystemTap probe descriptors)
    Provider: fix
    Name: args0
    Location: 0x0000000000001226, Base: 0x0000000000002034, Semaphore: 0x00000000000040b0
    Arguments:
"""


def test_parse_readelf_notes_reads_every_field() -> None:
    notes = parse_readelf_notes(_READELF_SAMPLE)
    assert notes == [
        {"provider": "fix", "name": "args2", "pc": 0x1221, "base": 0x2034, "semaphore": 0,
         "args": "-4@%eax -8@%rsi"},
        {"provider": "fix", "name": "args0", "pc": 0x1226, "base": 0x2034,
         "semaphore": 0x40B0, "args": ""},
    ]


def test_parse_readelf_notes_ignores_other_notes() -> None:
    assert parse_readelf_notes("Displaying notes found in: .note.gnu.build-id\n"
                               "    Build ID: 6cdeb36b\n") == []


def _fake_set(notes: list[tuple[str, str, int, int, str]], code: bytes = b"") -> ProbeSet:
    """A ProbeSet built from note fields (and the site's bytes) only: the comparators read
    nothing else."""
    from usdtpatch.analysis.probes import Probe
    from usdtpatch.elf.args import parse_args
    from usdtpatch.elf.notes import SdtNote
    from usdtpatch.x86.nops import SiteClass, SiteForm

    probes = tuple(
        Probe(i, SdtNote(0, 0x1000 + i, base, sem, prov, name, args), 0x1000 + i, None, None,
              parse_args(args), SiteClass(SiteForm.NOP5, 5, 5), code, None, 0)
        for i, (prov, name, base, sem, args) in enumerate(notes))
    return ProbeSet(None, None, probes, ())  # type: ignore[arg-type]


_BASE_NOTES = [("p", "a", 0x2000, 0, "-4@%edi 8@-16(%rsp)"), ("p", "b", 0x2000, 0x4000, "")]


def test_compare_notes_accepts_equal_notes() -> None:
    assert compare_notes(_fake_set(_BASE_NOTES), _fake_set(_BASE_NOTES)) == []


@pytest.mark.parametrize("changed", [
    [("q", "a", 0x2000, 0, "-4@%edi 8@-16(%rsp)"), _BASE_NOTES[1]],
    [("p", "x", 0x2000, 0, "-4@%edi 8@-16(%rsp)"), _BASE_NOTES[1]],
    [("p", "a", 0x2001, 0, "-4@%edi 8@-16(%rsp)"), _BASE_NOTES[1]],
    [("p", "a", 0x2000, 8, "-4@%edi 8@-16(%rsp)"), _BASE_NOTES[1]],
    [("p", "a", 0x2000, 0, "4@%edi 8@-16(%rsp)"), _BASE_NOTES[1]],
    [("p", "a", 0x2000, 0, "-4@%edi 8@-8(%rsp)"), _BASE_NOTES[1]],
    [_BASE_NOTES[0]],
], ids=["provider", "name", "base", "semaphore", "sign", "operand", "count"])
def test_compare_notes_rejects_each_field(changed: list[tuple[str, str, int, int, str]]) -> None:
    assert compare_notes(_fake_set(_BASE_NOTES), _fake_set(changed))
    assert compare_notes(_fake_set(_BASE_NOTES), _fake_set(changed), registers_may_differ=True)


def test_compare_notes_register_names_only_when_allowed() -> None:
    other = [("p", "a", 0x2000, 0, "-4@%eax 8@-16(%rsp)"), _BASE_NOTES[1]]
    assert compare_notes(_fake_set(_BASE_NOTES), _fake_set(other))
    assert compare_notes(_fake_set(_BASE_NOTES), _fake_set(other), registers_may_differ=True) == []
    to_memory = [("p", "a", 0x2000, 0, "-4@-4(%rbp) 8@-16(%rsp)"), _BASE_NOTES[1]]
    assert compare_notes(_fake_set(_BASE_NOTES), _fake_set(to_memory),
                         registers_may_differ=True)


def test_rsp_relative_finds_base_and_index_uses() -> None:
    ps = _fake_set([("p", "a", 0, 0, "8@8(%rsp) 8@(%rax,%rbx,8) -4@%esp 8@-8(%rbp)")])
    assert rsp_relative(ps) == ["p:a: 8@8(%rsp)"]
    assert rsp_relative(_fake_set([("p", "a", 0, 0, "8@%rdi 8@g(%rip)")])) == []


def test_compare_notes_guarded_accepts_registers_for_memory() -> None:
    guarded = [("p", "a", 0x2000, 0, "-4@%edi 8@%rax"), ("p", "b", 0x2000, 0x4000, "")]
    assert compare_notes_guarded(_fake_set(_BASE_NOTES), _fake_set(guarded)) == []


@pytest.mark.parametrize("changed", [
    [("p", "a", 0x2000, 0, "-4@%edi 8@-16(%rsp)"), _BASE_NOTES[1]],  # memory at a guarded site
    [("p", "a", 0x2000, 0, "-4@%edi -8@%rax"), _BASE_NOTES[1]],  # sign
    [("p", "a", 0x2000, 0, "-4@%edi 4@%eax"), _BASE_NOTES[1]],  # size
    [("q", "a", 0x2000, 0, "-4@%edi 8@%rax"), _BASE_NOTES[1]],  # provider
    [("p", "a", 0x2000, 0, "-4@%edi 8@%rax"), ("p", "b", 0x2000, 0, "")],  # semaphore
    [("p", "a", 0x2000, 0, "-4@%edi"), _BASE_NOTES[1]],  # argument count
    [("p", "a", 0x2000, 0, "-4@%edi 8@%rax")],  # note count
], ids=["memory", "sign", "size", "provider", "semaphore", "arg-count", "note-count"])
def test_compare_notes_guarded_rejects(changed: list[tuple[str, str, int, int, str]]) -> None:
    assert compare_notes_guarded(_fake_set(_BASE_NOTES), _fake_set(changed))


def test_compare_notes_guarded_immediates_and_fallback() -> None:
    imm = [("p", "c", 0, 0, "-4@$5")]
    assert compare_notes_guarded(_fake_set(imm), _fake_set(imm)) == []
    assert compare_notes_guarded(_fake_set(imm), _fake_set([("p", "c", 0, 0, "-4@$6")]))
    assert compare_notes_guarded(_fake_set(imm), _fake_set([("p", "c", 0, 0, "-4@%eax")]))
    # an unguarded fallback site (1-byte nop) must equal systemtap's exactly, memory and all
    assert compare_notes_guarded(_fake_set(_BASE_NOTES), _fake_set(_BASE_NOTES, b"\x90")) == []
    regs = [("p", "a", 0x2000, 0, "-4@%edi 8@%rax"), _BASE_NOTES[1]]
    assert compare_notes_guarded(_fake_set(_BASE_NOTES), _fake_set(regs, b"\x90"))
    # another stack slot of the same frame is allowed there, another base register is not
    slot = [("p", "a", 0x2000, 0, "-4@%edi 8@-24(%rsp)"), _BASE_NOTES[1]]
    assert compare_notes_guarded(_fake_set(_BASE_NOTES), _fake_set(slot, b"\x90")) == []
    other = [("p", "a", 0x2000, 0, "-4@%edi 8@-16(%rbp)"), _BASE_NOTES[1]]
    assert compare_notes_guarded(_fake_set(_BASE_NOTES), _fake_set(other, b"\x90"))
    # another register for a register is allowed there, a register for memory is not
    reg = [("p", "a", 0x2000, 0, "-4@%esi 8@-16(%rsp)"), _BASE_NOTES[1]]
    assert compare_notes_guarded(_fake_set(_BASE_NOTES), _fake_set(reg, b"\x90")) == []
    mem = [("p", "a", 0x2000, 0, "-4@-4(%rbp) 8@-16(%rsp)"), _BASE_NOTES[1]]
    assert compare_notes_guarded(_fake_set(_BASE_NOTES), _fake_set(mem, b"\x90"))
