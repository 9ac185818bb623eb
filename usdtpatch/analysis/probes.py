"""The probes of an ELF file: notes resolved against the image (one pure function).

What each consumer does with a note is in docs/usdt-format.md. Here, as in
libbpf and gdb: when the note's `base` and the address of `.stapsdt.base` are both nonzero and
differ (the file was prelinked or otherwise moved), their difference is added to the pc and to a
nonzero semaphore address.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from usdtpatch.elf.args import SdtArg, UnknownOperand, parse_args
from usdtpatch.elf.image import (
    EM_386,
    EM_X86_64,
    ET_DYN,
    ET_EXEC,
    ET_REL,
    SHT_NOTE,
    ElfImage,
)
from usdtpatch.elf.notes import NoteSection, RawNote, SdtNote, parse_notes
from usdtpatch.elf.symbols import SymbolTable, load_symbols
from usdtpatch.findings import (
    ARG_NO_SIZE,
    ARG_UNKNOWN_FORM,
    BIG_ENDIAN,
    NO_STAPSDT_BASE,
    NOT_LINKED,
    NOTE_BASE_MOVED,
    NOTE_FOREIGN,
    NOTE_MALFORMED,
    NOTE_SECTION_TYPE,
    NOTE_TRUNCATED,
    PC_OUTSIDE_SEGMENTS,
    SITE_PROBE_LOST,
    TOO_MANY_ARGS,
    UNSUPPORTED_ARCH,
    Finding,
)
from usdtpatch.kernelfacts import GENERATIONS
from usdtpatch.x86.nops import SiteClass, SiteForm, classify_site, decode_nop

NOTE_SECTION = ".note.stapsdt"
BASE_SECTION = ".stapsdt.base"
MAX_ARGS = 12  # STAP_PROBE12 is the largest probe sys/sdt.h defines
SITE_WINDOW = 16  # bytes read at each pc for classification and display


@dataclass(frozen=True, slots=True)
class Semaphore:
    address: int
    offset: int | None  # file offset, None when the address is in no PT_LOAD's file part
    section: str | None


@dataclass(frozen=True, slots=True)
class Probe:
    index: int  # position among the file's SDT notes
    note: SdtNote
    address: int  # link-time address of the site (pc after the base adjustment)
    offset: int | None  # file offset of the site
    semaphore: Semaphore | None
    args: tuple[SdtArg, ...]
    site: SiteClass
    code: bytes  # up to SITE_WINDOW file bytes at the site
    function: str | None  # the containing function's symbol (mangled), None when unknown
    function_offset: int  # offset of the site into that function

    @property
    def provider(self) -> str:
        return self.note.provider

    @property
    def name(self) -> str:
        return self.note.name

    @property
    def probe_id(self) -> str:
        return self.note.probe_id


@dataclass(frozen=True, slots=True)
class ProbeSet:
    image: ElfImage
    notes: NoteSection | None  # None when the file has no .note.stapsdt
    probes: tuple[Probe, ...]
    findings: tuple[Finding, ...]
    symbols: SymbolTable | None = field(default=None, repr=False, compare=False)  # reused


def is_x86(image: ElfImage) -> bool:
    return image.machine in (EM_X86_64, EM_386)


def not_linked_message(elf_type: int) -> str:
    """What not-linked says of an ELF file of type `elf_type` (not ET_EXEC nor ET_DYN)."""
    what = "a relocatable object" if elf_type == ET_REL else "not an executable or shared object"
    return f"not linked (ELF type {elf_type}: {what}): its note addresses are not final"


def no_match(path: str, patterns: Sequence[str], probes: Iterable[str]) -> str:
    """The one line of every command whose --probe (or list's --provider) pattern selects
    nothing: exit 2, naming the patterns and the probes there are (`provider:name`, the
    first ten), so a typo in a build or CI step fails instead of passing on nothing."""
    known = sorted(set(probes))
    shown = ", ".join(known[:10]) + (f", ... ({len(known)} in all)" if len(known) > 10 else "")
    return (f"{path}: no probe matches {' or '.join(patterns)} "
            f"(probes: {shown or 'none, the file has no USDT probes'})")


def read_probes(image: ElfImage, symbols: SymbolTable | None = None) -> ProbeSet:
    """Every SDT probe of `image`, with findings for what is odd about the file or a note."""
    findings: list[Finding] = []
    sec = image.section(NOTE_SECTION)
    if sec is None:
        return ProbeSet(image, None, (), ())
    if sec.type != SHT_NOTE:
        findings.append(NOTE_SECTION_TYPE.finding(
            f"{NOTE_SECTION} has section type {sec.type}, expected {SHT_NOTE} (SHT_NOTE)",
            NOTE_SECTION))
    notes = parse_notes(image.section_data(sec), image.word_size, image.byteorder)
    for raw in notes.notes:
        if isinstance(raw, RawNote):
            findings.append(_raw_note_finding(raw))
    if notes.trailer:
        findings.append(NOTE_TRUNCATED.finding(
            f"{notes.trailer_reason}; the rest of the section ({len(notes.trailer)} bytes) "
            f"holds no readable note", f"{NOTE_SECTION}+{sec.size - len(notes.trailer):#x}"))
    x86 = is_x86(image)
    if not x86:
        findings.append(UNSUPPORTED_ARCH.finding(
            f"{image.machine_name} code: probes are listed, their sites are not classified"))
    elif not image.little_endian:
        findings.append(BIG_ENDIAN.finding(
            "big-endian x86 ELF: probes are listed, nothing else is done"))
    linked = image.type in (ET_EXEC, ET_DYN)
    if not linked and notes.sdt_notes:
        findings.append(NOT_LINKED.finding(not_linked_message(image.type)))

    base_sec = image.section(BASE_SECTION)
    base_addr = base_sec.addr if base_sec is not None else 0
    if base_sec is None and notes.sdt_notes:
        findings.append(NO_STAPSDT_BASE.finding(
            f"no {BASE_SECTION} section: note addresses are used as they are"))
    if symbols is None:
        symbols = load_symbols(image)

    probes: list[Probe] = []
    for i, note in enumerate(notes.sdt_notes):
        where = f"{note.probe_id}"
        adjust = base_addr - note.base if (base_addr and note.base) else 0
        if adjust and i == 0:
            findings.append(NOTE_BASE_MOVED.finding(
                f"note base {note.base:#x} differs from {BASE_SECTION} at {base_addr:#x}: "
                f"addresses moved by {adjust:+#x} (prelinked or relocated file)", where))
        address = (note.pc + adjust) & ((1 << (8 * image.word_size)) - 1)
        offset = image.vaddr_to_offset(address)
        code = image.read_vaddr(address, SITE_WINDOW)
        if not x86:
            site = SiteClass(SiteForm.UNSUPPORTED_ARCH, 0, 0)
        else:
            site = classify_site(code)
        if offset is None and linked:  # an object's pcs are section offsets: not-linked
            findings.append(PC_OUTSIDE_SEGMENTS.finding(
                f"probe address {address:#x} is in no loadable segment's file bytes", where))
        elif x86 and site.form in PREFIXED_FORMS:
            lost = lost_on(code)
            if lost:
                findings.append(SITE_PROBE_LOST.finding(lost, where))
        sem = None
        if note.semaphore:
            sem_addr = (note.semaphore + adjust) & ((1 << (8 * image.word_size)) - 1)
            sem_sec = image.section_for_vaddr(sem_addr)
            sem = Semaphore(sem_addr, image.vaddr_to_offset(sem_addr),
                            sem_sec.name if sem_sec is not None else None)
        args = parse_args(note.args, x86=x86)
        if len(args) > MAX_ARGS:
            findings.append(TOO_MANY_ARGS.finding(
                f"{len(args)} arguments; sys/sdt.h defines at most {MAX_ARGS}", where))
        for a in args:
            if x86 and a.size is None and not isinstance(a.operand, UnknownOperand):
                findings.append(ARG_NO_SIZE.finding(
                    f"argument {a.raw!r} has no N@ size prefix (old note style)", where))
            if x86 and isinstance(a.operand, UnknownOperand):
                findings.append(ARG_UNKNOWN_FORM.finding(
                    f"argument {a.raw!r}: {a.operand.reason}", where))
        fn = symbols.lookup(address)
        function, function_offset = (fn[0].name, fn[1]) if fn is not None else (None, 0)
        probes.append(Probe(index=i, note=note, address=address, offset=offset, semaphore=sem,
                            args=args, site=site, code=code, function=function,
                            function_offset=function_offset))
    return ProbeSet(image=image, notes=notes, probes=tuple(probes), findings=tuple(findings),
                    symbols=symbols)


# the site forms whose NOP may carry a segment prefix (the others are plain NOPs, 0f 1f or 90)
PREFIXED_FORMS = frozenset({SiteForm.NOP10, SiteForm.OTHER})


def lost_on(code: bytes) -> str:
    """Why a probe on the NOP at code[0] is lost on some kernel generations but not all (the
    kernel refuses a CS- or DS-prefixed instruction: errno 524 for a process, a system-wide
    probe that never fires; a bare nop10 is probed by its generation alone), in words; "" when
    every generation probes it, or none does (check's site-segment-prefix says that)."""
    nop = decode_nop(code[:15])
    if nop is None:
        return ""
    lost = [g.name for g in GENERATIONS if not g.probeable(code, nop.prefixes)]
    if not lost:
        return ""
    kept = [g.name for g in GENERATIONS if g.name not in lost]
    if not kept:
        return ""
    return (f"{nop.length}-byte NOP {code[:nop.length].hex(' ')} at pc: only the "
            f"{', '.join(kept)} generation probes it; on the "
            f"{', '.join(lost)} generation(s) a probe here is silently lost (never hit; "
            f"errno 524 for a process)")


def _raw_note_finding(raw: RawNote) -> Finding:
    where = f"{NOTE_SECTION}+{raw.offset:#x}"
    if raw.foreign:
        return NOTE_FOREIGN.finding(
            f"a note that is not an SDT note ({len(raw.data)} bytes) sits in {NOTE_SECTION}",
            where)
    return NOTE_MALFORMED.finding(raw.reason, where)
