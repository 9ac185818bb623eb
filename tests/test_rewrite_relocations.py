"""The plan's relocation look-ups (usdtpatch.rewriter.plan.Relocations): a retargeted 8-byte
jump-table entry of a position-independent file gets its value from an R_X86_64_RELATIVE
relocation, whose addend the rewrite changes too. The plan reads each SHT_RELA table once
(usdtpatch.elf.relocs.RelaTable, on the first question) and looks every place up in it; the
answers are those of the whole-table readers of usdtpatch.elf.relocs."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.helpers import REAL_BINARIES, fixture
from usdtpatch.analysis.check import check
from usdtpatch.analysis.probes import read_probes
from usdtpatch.elf.image import SHF_ALLOC, SHT_RELA, ElfImage, parse_elf
from usdtpatch.elf.model import R_X86_64_RELATIVE
from usdtpatch.elf.relocs import RelaTable, rela_table, relative_relocations
from usdtpatch.findings import WINDOW_WAY_IN
from usdtpatch.rewriter import plan as plan_module
from usdtpatch.rewriter.plan import Action, Relocations, plan_rewrite


def _image(path: Path) -> ElfImage:
    return parse_elf(path.read_bytes())


def _reference(image: ElfImage, place: int) -> tuple[int, int | None] | None:
    """What the plan must answer for `place`, from the whole-table readers: the addend of
    relative_relocations(), and the address of the addend field of the first
    R_X86_64_RELATIVE entry at `place` in an allocated SHT_RELA section."""
    addend = relative_relocations(image).get(place)
    if addend is None:
        return None
    for sec in image.sections:
        if sec.type != SHT_RELA or not sec.allocated or not sec.addr:
            continue
        for off, r_offset, rtype, _addend in rela_table(image, sec.offset, sec.size):
            if r_offset == place and rtype == R_X86_64_RELATIVE:
                return addend, sec.addr + (off - sec.offset) + 16
    return addend, None


class _Counting(RelaTable):
    """RelaTable that counts how often each table (by file offset) is read."""

    reads: ClassVar[dict[int, int]] = {}

    def __init__(self, image: ElfImage, offset: int, size: int) -> None:
        _Counting.reads[offset] = _Counting.reads.get(offset, 0) + 1
        super().__init__(image, offset, size)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    _Counting.reads = {}
    monkeypatch.setattr(plan_module, "RelaTable", _Counting, raising=False)
    return _Counting.reads


def _rela_offsets(image: ElfImage) -> list[int]:
    return [s.offset for s in image.sections if s.type == SHT_RELA]


@pytest.mark.parametrize("name", ["retarget-pie", "pie", "libprobes.so", "fork"])
def test_relative_answers_as_the_whole_table_readers(name: str) -> None:
    image = _image(fixture(name))
    places = sorted(relative_relocations(image))
    assert places, f"{name} has no R_X86_64_RELATIVE relocation to look up"
    relocs = Relocations(image)
    for place in places:
        got = relocs.relative(place)
        assert got == _reference(image, place), hex(place)
        assert got is not None and got[1] is not None
        # the field holds the addend, 16 bytes after its entry's r_offset
        assert bytes(image.read_vaddr(got[1], 8)) == struct.pack("<q", got[0])
        assert bytes(image.read_vaddr(got[1] - 16, 8)) == struct.pack("<Q", place)
    # places no RELATIVE entry relocates: between entries, and the import slots
    for place in {p + 1 for p in places} | {p + 4 for p in places}:
        if place not in relative_relocations(image):
            assert relocs.relative(place) is None, hex(place)
    others = [r_offset for sec in image.sections if sec.type == SHT_RELA
              for _o, r_offset, rtype, _a in rela_table(image, sec.offset, sec.size)
              if rtype != R_X86_64_RELATIVE and r_offset not in relative_relocations(image)]
    for place in others:
        assert relocs.relative(place) is None, hex(place)
    assert relocs.relative(0) is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["libstdc++", "libjvm"])
def test_relative_answers_as_the_whole_table_readers_on_real_binaries(name: str) -> None:
    path = REAL_BINARIES[name]
    if not path.exists():
        pytest.skip(f"{path} is not installed")
    image = _image(path)
    relative = relative_relocations(image)
    places = sorted(relative)[::97]  # a sample: the reference decodes every table per place
    assert places
    relocs = Relocations(image)
    whole: dict[int, int] = {}  # first RELATIVE entry per place in allocated tables
    for sec in image.sections:
        if sec.type == SHT_RELA and sec.allocated and sec.addr:
            for off, r_offset, rtype, _a in rela_table(image, sec.offset, sec.size):
                if rtype == R_X86_64_RELATIVE:
                    whole.setdefault(r_offset, sec.addr + (off - sec.offset) + 16)
    for place in places:
        assert relocs.relative(place) == (relative[place], whole.get(place)), hex(place)
        assert relocs.relative(place + 1) is None


def test_each_table_is_read_once_and_only_when_asked(counting: dict[int, int]) -> None:
    image = _image(fixture("retarget-pie"))
    relocs = Relocations(image)
    assert counting == {}  # nothing read before the first question
    places = sorted(relative_relocations(image))
    for place in places * 3:
        relocs.relative(place)
        relocs.relative(place + 8)
    assert counting == dict.fromkeys(_rela_offsets(image), 1)
    assert len(places) > 1


def _decide(image: ElfImage, **options: Any) -> plan_module.RewritePlan:
    """The plan of `image`, without the verifier, with check's report made beforehand (so
    only the plan's own reads are counted)."""
    report = check(read_probes(image))
    return plan_rewrite(image, verify=None, report=report, **options)


def test_the_plan_reads_each_table_once(counting: dict[int, int]) -> None:
    image = _image(fixture("retarget-pie"))
    plan = _decide(image)
    site = next(s for s in plan.sites if s.probe.name == "swtab8")
    assert site.action is Action.DETOUR
    assert any("R_X86_64_RELATIVE addend" in w for w in site.retargeted)
    assert counting == dict.fromkeys(_rela_offsets(image), 1)


def test_a_plan_that_asks_nothing_reads_no_table(counting: dict[int, int]) -> None:
    image = _image(fixture("pie"))
    assert _rela_offsets(image)
    assert _decide(image).rewritten
    assert counting == {}


def _unallocated_rela(src: Path) -> bytes:
    """A copy of `src` whose allocated SHT_RELA sections lose SHF_ALLOC in their headers (the
    loader's table is then not a section the plan may edit)."""
    data = bytearray(src.read_bytes())
    image = parse_elf(bytes(data))
    for sec in image.sections:
        if sec.type == SHT_RELA and sec.allocated:
            at = image.shoff + sec.index * 64 + 8  # Elf64_Shdr.sh_flags
            struct.pack_into("<Q", data, at, sec.flags & ~SHF_ALLOC)
    return bytes(data)


def test_an_addend_outside_a_loaded_table_is_refused() -> None:
    image = parse_elf(_unallocated_rela(fixture("retarget-pie")))
    place = next(iter(sorted(relative_relocations(image))))
    addend, at = Relocations(image).relative(place) or (None, 0)
    assert addend == relative_relocations(image)[place] and at is None
    site = next(s for s in _decide(image).sites if s.probe.name == "swtab8")
    assert site.action is Action.SKIPPED
    assert site.code == WINDOW_WAY_IN.code
    assert "not in a loaded SHT_RELA table" in site.reason
