"""Rewrite a file: decide each site, build the detours and their unwind info, write the file.

Reference: shared/design/usdt-and-rewriting.md. The flow is one way: probes and their check
(patch windows, red-zone verdicts, from usdtpatch.sites.check) -> per-site decisions -> detours
laid out in the new segment -> call frame information -> symbols, notes, the restore marker ->
usdtpatch.elf.writer. Nothing is written here; the caller gets bytes.

Every detour is handed to `verify` (the emulator's equivalence check) before it is accepted;
a site whose detour fails is left as it was and reported.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace

from usdtpatch import __version__
from usdtpatch.elf.cfi import CfiIndex, load_cfi
from usdtpatch.elf.ehframe import (
    RSP,
    Row,
    build_cie,
    build_eh_frame_hdr,
    build_fde,
    copy_eh_frame,
    rows_at,
)
from usdtpatch.elf.image import (
    EM_X86_64,
    ET_DYN,
    PT_GNU_EH_FRAME,
    SHF_EXECINSTR,
    SHT_NOTE,
    SHT_PROGBITS,
    SHT_REL,
    SHT_RELA,
    SHT_STRTAB,
    SHT_SYMTAB,
    ElfImage,
)
from usdtpatch.elf.notes import NoteSection, SdtNote, serialize_notes
from usdtpatch.elf.writer import (
    AllocSection,
    Rewrite,
    SegmentLayout,
    TailSection,
    plan_segment,
    write,
)
from usdtpatch.errors import UnsupportedError
from usdtpatch.report.findings import Finding, Severity
from usdtpatch.rewrite.forms import (
    Form,
    Guard,
    guard_args,
    site_bytes,
    uses_numeric_rip,
)
from usdtpatch.sites.check import CheckReport, SiteCheck, check
from usdtpatch.sites.probes import BASE_SECTION, NOTE_SECTION, Probe, ProbeSet, read_probes
from usdtpatch.sites.windows import PatchWindow, WindowShape
from usdtpatch.x86.decode import sweep
from usdtpatch.x86.nops import GUARD_ENTER, RED_ZONE, SiteForm, crosses_page
from usdtpatch.x86.relocate import Detour, RelocationError, Replacement, jmp_rel32, relocate_window

MARKER_SECTION = ".note.usdtpatch"
MARKER_OWNER = b"usdtpatch\0"
MARKER_TYPE = 1
TEXT_SECTION = ".usdtpatch.text"
INT3 = 0xCC

# verify(image, window, detour, replaced probe addresses) -> None when equivalent, else why
Verifier = Callable[[ElfImage, PatchWindow, Detour, tuple[int, ...]], str | None]


class AlreadyRewritten(UnsupportedError):
    """The file carries a usdtpatch marker: rewriting it again is a no-op."""


@dataclass(frozen=True, slots=True)
class SiteOutcome:
    probe: Probe
    action: str  # "in-place", "detour", "moved" (rewritten inside another site's window), "skipped"
    code: str | None  # why skipped (a finding code)
    reason: str
    new_pc: int | None
    window: PatchWindow | None
    detour: Detour | None
    guarded: bool
    extra_jumps: int


@dataclass(frozen=True, slots=True)
class RewriteResult:
    data: bytes | None  # None: nothing to change
    sites: tuple[SiteOutcome, ...]
    findings: tuple[Finding, ...]
    form: Form
    guard: Guard

    @property
    def rewritten(self) -> int:
        return sum(1 for s in self.sites if s.action in ("in-place", "detour", "moved"))


def marker_of(image: ElfImage) -> dict[str, object] | None:
    """The restore marker of a rewritten file, or None."""
    sec = image.section(MARKER_SECTION)
    if sec is None:
        return None
    data = image.section_data(sec)
    if len(data) < 12:
        raise UnsupportedError(f"{MARKER_SECTION} is truncated")
    namesz, descsz, ntype = struct.unpack_from("<III", data, 0)
    name_end = 12 + ((namesz + 3) & ~3)
    if data[12 : 12 + namesz] != MARKER_OWNER or ntype != MARKER_TYPE or \
            name_end + descsz > len(data):
        raise UnsupportedError(f"{MARKER_SECTION} is not a usdtpatch marker")
    try:
        doc = json.loads(data[name_end : name_end + descsz].rstrip(b"\0"))
    except ValueError as exc:
        raise UnsupportedError(f"{MARKER_SECTION} does not hold valid JSON") from exc
    if not isinstance(doc, dict):
        raise UnsupportedError(f"{MARKER_SECTION} does not hold a JSON object")
    return doc


def _marker_note(doc: dict[str, object]) -> bytes:
    desc = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    desc += b"\0" * ((-len(desc)) % 4)
    name = MARKER_OWNER + b"\0" * ((-len(MARKER_OWNER)) % 4)
    return struct.pack("<III", len(MARKER_OWNER), len(desc), MARKER_TYPE) + name + desc


def _build_id(image: ElfImage) -> str | None:
    sec = image.section(".note.gnu.build-id")
    if sec is None:
        return None
    data = image.section_data(sec)
    if len(data) < 16:
        return None
    namesz, descsz, _ = struct.unpack_from("<III", data, 0)
    off = 12 + ((namesz + 3) & ~3)
    return data[off : off + descsz].hex() or None


def _skip(sc: SiteCheck, code: str, reason: str) -> SiteOutcome:
    return SiteOutcome(sc.probe, "skipped", code, reason, None, None, None, False, 0)


def _needs_guard(sc: SiteCheck, guard: Guard) -> bool:
    if guard is Guard.ALWAYS:
        return True
    if guard is Guard.NEVER:
        return False
    return sc.red_zone is None or sc.red_zone.may_use


def rewrite_image(image: ElfImage, form: Form = Form.NOP5, guard: Guard = Guard.AUTO,
                  verify: Verifier | None = None, report: CheckReport | None = None,
                  progress: Callable[[int, int], None] | None = None) -> RewriteResult:
    """Plan and build the rewritten file for `image` (pure: bytes in, bytes out).

    `progress(done, total)`, when given, is called after each site is decided.
    """
    if marker_of(image) is not None:
        raise AlreadyRewritten("already rewritten by usdtpatch (it carries a "
                               f"{MARKER_SECTION} marker); `usdtpatch restore` gives the original")
    if image.machine != EM_X86_64 or not image.is64 or not image.little_endian:
        raise UnsupportedError(f"rewriting needs x86-64 ELF64 little-endian code, this is "
                               f"{image.machine_name} ELF{64 if image.is64 else 32}")
    ps: ProbeSet = report.probeset if report is not None else read_probes(image)
    if ps.notes is None or not ps.probes:
        return RewriteResult(None, (), ps.findings, form, guard)
    rep = report if report is not None else check(ps)
    base_sec = image.section(BASE_SECTION)
    layout = plan_segment(image, base_sec.addr if base_sec is not None else None)

    cursor = layout.payload_vaddr
    text = bytearray()
    text_addr = cursor
    outcomes: dict[int, SiteOutcome] = {}
    patches: list[tuple[int, bytes]] = []
    claimed: list[tuple[int, int]] = []
    detour_rows: list[tuple[Detour, list[tuple[int, Row]]]] = []
    new_args: dict[int, str] = {}
    findings: list[Finding] = list(rep.findings)
    cfi = load_cfi(image)
    by_address = {sc.probe.address: sc for sc in rep.sites}

    for n, sc in enumerate(sorted(rep.sites, key=lambda s: s.probe.address)):
        if progress is not None:
            progress(n, len(rep.sites))
        p = sc.probe
        if p.index in outcomes:
            continue
        if p.site.form in (SiteForm.NOP5, SiteForm.NOP5_ALT) and crosses_page(p.address, 5):
            # the kernel never optimizes a nop5 that crosses a page where it is: move it
            win = _page_crossing_window(p)
        elif p.site.form in (SiteForm.NOP5, SiteForm.NOP5_ALT, SiteForm.COMBO5,
                             SiteForm.COMBO10, SiteForm.NOP10):
            outcomes[p.index] = _skip(sc, "site-already-5-byte",
                                      f"already a {p.site.form.value} site")
            continue
        else:
            wr = sc.window
            if wr is None or wr.window is None:
                outcomes[p.index] = _skip(sc, sc.blocked or (wr.code if wr else None) or
                                          "no-patch-window",
                                          wr.reason if wr is not None else "no patch window")
                continue
            win = wr.window
        if any(s < win.end and win.start < e for s, e in claimed):
            outcomes[p.index] = _skip(sc, "window-overlaps-site",
                                      "its window overlaps another rewritten site's")
            continue
        members = [by_address[a] for a in sorted(by_address) if win.start <= a < win.end]
        guarded = any(_needs_guard(m, guard) for m in members)
        bad = None
        for m in members:
            if guarded:
                args, why = guard_args(m.probe.args)
                if why is not None:
                    bad = ("guard-impossible", f"{m.probe.probe_id}: {why}")
                    break
                new_args[m.probe.index] = args
            numeric = uses_numeric_rip(m.probe.args)
            if numeric is not None and win.shape is not WindowShape.IN_PLACE:
                bad = ("arg-rip-relative", f"{m.probe.probe_id}: argument {numeric!r} is read "
                                           f"relative to rip and would move")
                break
        if bad is not None:
            outcomes[p.index] = _skip(sc, bad[0], bad[1])
            for m in members:
                new_args.pop(m.probe.index, None)
            continue
        sb = site_bytes(form, guarded)
        start_off = image.vaddr_to_offset(win.start)
        if start_off is None:
            outcomes[p.index] = _skip(sc, "pc-outside-segments", "window not in the file")
            continue

        in_place_ok = (win.shape is WindowShape.IN_PLACE and len(members) == 1
                       and len(sb.code) <= win.end - p.address and p.address == win.start
                       and not crosses_page(p.address + sb.optimized_offset,
                                            form.optimized_length))
        if in_place_ok:
            code = sb.code + b"\x90" * (win.end - win.start - len(sb.code))
            patches.append((start_off, code))
            claimed.append((win.start, win.end))
            outcomes[p.index] = SiteOutcome(p, "in-place", None,
                                            f"{form.value} written over {win.size} bytes of NOPs",
                                            p.address + sb.pc_offset, win, None, guarded, 0)
            continue

        # the probe instruction's real length (a hint-NOP or DS-prefixed nop5 site is 5 bytes;
        # `site.length` is None for the forms it does not classify as 1-byte nops)
        sizes = {i.address: i.size for i in win.insns}
        reps = [Replacement(m.probe.address, sizes.get(m.probe.address,
                                                      m.probe.site.length or 1), sb.code)
                for m in members]
        detour = None
        try:
            for _ in range(2):
                at = (cursor + 15) & ~15
                detour = relocate_window(win.code, win.start, reps, at)
                bad_page = [a for a, b in detour.insn_map
                            if a in {r.address for r in reps}
                            and crosses_page(b + sb.optimized_offset, form.optimized_length)]
                if not bad_page:
                    break
                cursor = (at + 4096) & ~4095  # move the detour to the next page
                detour = None
            if detour is None:
                raise RelocationError("the new site would cross a page")
            jmp = jmp_rel32(win.start, detour.address)
        except RelocationError as exc:
            outcomes[p.index] = _skip(sc, "relocation-failed", str(exc))
            continue
        if verify is not None:
            why = verify(image, win, detour, tuple(r.address for r in reps))
            if why is not None:
                outcomes[p.index] = _skip(sc, "verification-failed", why)
                continue
        rows = _detour_rows(cfi, win, detour, guarded)
        if isinstance(rows, str):
            findings.append(Finding("detour-without-cfi", Severity.INFO,
                                    f"{p.probe_id}: {rows}", "debuggers cannot unwind from "
                                    "inside this detour", p.probe_id))
        else:
            detour_rows.append((detour, rows))
        text += b"\xcc" * (detour.address - (text_addr + len(text))) + detour.code
        cursor = detour.end
        patches.append((start_off, jmp + bytes([INT3]) * (win.size - len(jmp))))
        claimed.append((win.start, win.end))
        mapping = dict(detour.insn_map)
        for m in members:
            new_pc = mapping[m.probe.address] + sb.pc_offset
            action = "detour" if m.probe.index == p.index else "moved"
            outcomes[m.probe.index] = SiteOutcome(
                m.probe, action, None,
                f"{win.shape.value} window of {win.size} bytes relocated to {detour.address:#x}",
                new_pc, win, detour, guarded, 2)

    ordered = tuple(outcomes[p.index] for p in ps.probes)
    if not patches:
        return RewriteResult(None, ordered, tuple(findings), form, guard)
    data = _assemble(image, ps, layout, bytes(text), text_addr, detour_rows, patches, ordered,
                     new_args, form, guard)
    return RewriteResult(data, ordered, tuple(findings), form, guard)


def _page_crossing_window(p: Probe) -> PatchWindow:
    """The window of a nop5 site that crosses a page: the nop5 alone, moved to a detour where
    it does not cross one (a jmp rel32 fills its 5 bytes exactly)."""
    code = p.code[:5]
    return PatchWindow(WindowShape.FORWARD, p.address, p.address + 5, p.address, 5,
                       sweep(code, p.address).insns, code, None, 5, 2,
                       "the probe's nop5, which crosses a 4 KiB page",
                       "the end of the nop5", (), (), p.address, p.address + 5)


def _detour_rows(cfi: CfiIndex, win: PatchWindow, detour: Detour,
                 guarded: bool) -> list[tuple[int, Row]] | str:
    fde = cfi.lookup(win.start)
    if fde is None:
        return f"no FDE covers the window at {win.start:#x}"
    try:
        rows = rows_at(fde, [a for a, _ in detour.insn_map])
    except UnsupportedError as exc:
        return f"the FDE at {fde.address:#x} cannot be replayed: {exc}"
    out: list[tuple[int, Row]] = []
    site_len = detour.site_length
    for orig, new in detour.insn_map:
        row = rows[orig]
        out.append((new, row))
        if guarded and orig != win.end and new + site_len <= detour.end and \
                detour.code[new - detour.address : new - detour.address + len(GUARD_ENTER)] == \
                GUARD_ENTER:
            if row.cfa.reg == RSP:
                out.append((new + len(GUARD_ENTER), row.with_cfa_offset(RED_ZONE)))
                out.append((new + site_len - 8, row.with_cfa_offset(RED_ZONE)))
                out.append((new + site_len, row))
            elif row.cfa.reg is None:
                return "the CFA is an expression at the probe; the guard cannot be described"
    return out


def _symtab(image: ElfImage, syms: list[tuple[str, int, int]], text_index: int
            ) -> tuple[TailSection, TailSection]:
    """`.symtab` and its string table with a local STT_FUNC symbol per detour added."""
    old = image.section(".symtab")
    entries: list[bytes] = []
    strtab = bytearray(b"\0")
    info = 1
    strtab_name = ".strtab"
    append_global = False
    if old is not None and old.type == SHT_SYMTAB and 0 < old.link < len(image.sections):
        str_sec = image.sections[old.link]
        strtab = bytearray(image.section_data(str_sec))
        strtab_name = str_sec.name
        raw = image.section_data(old)
        entries = [raw[i : i + 24] for i in range(0, len(raw) - len(raw) % 24, 24)]
        info = old.info
        # relocation sections that index .symtab would see indices move: append instead
        old_index = old.index
        append_global = any(s.type in (SHT_REL, SHT_RELA) and s.link == old_index
                            for s in image.sections)
    else:
        entries = [b"\0" * 24]
    new: list[bytes] = []
    for name, addr, size in syms:
        off = len(strtab)
        strtab += name.encode() + b"\0"
        bind = 1 if append_global else 0
        new.append(struct.pack("<IBBHQQ", off, (bind << 4) | 2, 2 if append_global else 0,
                               text_index, addr, size))
    if append_global:
        entries += new
    else:
        entries = entries[:info] + new + entries[info:]
        info += len(new)
    return (TailSection(".symtab", SHT_SYMTAB, b"".join(entries), 8, 24, strtab_name, info),
            TailSection(strtab_name, SHT_STRTAB, bytes(strtab), 1))


def _assemble(image: ElfImage, ps: ProbeSet, layout: SegmentLayout, text: bytes,
              text_addr: int,
              detour_rows: list[tuple[Detour, list[tuple[int, Row]]]],
              patches: list[tuple[int, bytes]], outcomes: tuple[SiteOutcome, ...],
              new_args: dict[int, str], form: Form, guard: Guard) -> bytes:
    alloc = [AllocSection(TEXT_SECTION, SHT_PROGBITS, 0x2 | SHF_EXECINSTR, text_addr, text)]
    renames: dict[str, str] = {}
    hdr_addr: int | None = None
    eh = image.section(".eh_frame")
    has_hdr = any(s.type == PT_GNU_EH_FRAME for s in image.segments)
    if eh is not None and eh.addr and has_hdr and detour_rows:
        eh_addr = (text_addr + len(text) + 7) & ~7
        copy, old_fdes = copy_eh_frame(image.section_data(eh), eh.addr, eh_addr, 8,
                                       image.type == ET_DYN)
        blob = bytearray(copy)
        cie_addr = eh_addr + len(blob)
        blob += build_cie()
        table = list(old_fdes)
        for detour, rows in detour_rows:
            fde_addr = eh_addr + len(blob)
            blob += build_fde(fde_addr, cie_addr, detour.address, detour.end, rows)
            table.append((detour.address, fde_addr))
        blob += b"\0\0\0\0"  # terminator
        hdr_addr = (eh_addr + len(blob) + 3) & ~3
        hdr = build_eh_frame_hdr(hdr_addr, eh_addr, table)
        alloc.append(AllocSection(".eh_frame", SHT_PROGBITS, 0x2, eh_addr, bytes(blob), 8))
        alloc.append(AllocSection(".eh_frame_hdr", SHT_PROGBITS, 0x2, hdr_addr, hdr, 4))
        renames = {".eh_frame": ".eh_frame.orig", ".eh_frame_hdr": ".eh_frame_hdr.orig"}

    # notes: the moved pcs and the guarded arguments
    notes = ps.notes
    assert isinstance(notes, NoteSection)
    changed: dict[int, SdtNote] = {}
    for o in outcomes:
        if o.new_pc is None:
            continue
        note = o.probe.note
        adjust = o.probe.address - note.pc
        changed[note.offset] = replace(note, pc=o.new_pc - adjust,
                                       args=new_args.get(o.probe.index, note.args))
    new_notes = NoteSection(tuple(changed.get(n.offset, n) if isinstance(n, SdtNote) else n
                                  for n in notes.notes), notes.trailer, notes.trailer_reason)
    note_bytes = serialize_notes(new_notes, 8, "<")

    text_index = len(image.sections)  # .usdtpatch.text is the first new section
    syms = []
    for o in outcomes:
        if o.action == "detour" and o.detour is not None:
            tag = f"{o.probe.provider}_{o.probe.name}_{o.probe.index}"
            syms.append((f"__usdtpatch_detour_{tag}", o.detour.address, len(o.detour.code)))
    symtab, strtab = _symtab(image, syms, text_index)

    original = {off: image.data[off : off + len(code)] for off, code in patches}
    marker: dict[str, object] = {
        "tool": "usdtpatch", "version": __version__, "form": form.value, "guard": guard.value,
        "original_size": len(image.data),
        "original_sha256": hashlib.sha256(image.data).hexdigest(),
        "elf_header": image.data[:64].hex(),
        "build_id": _build_id(image),
        "patches": [[off, original[off].hex()] for off, _ in sorted(patches)],
        "sites": [{"probe": o.probe.probe_id, "address": o.probe.address, "action": o.action,
                   "new_pc": o.new_pc, "guarded": o.guarded, "reason": o.reason,
                   "window": None if o.window is None else [o.window.start, o.window.end]}
                  for o in outcomes],
    }
    tail = [TailSection(NOTE_SECTION, SHT_NOTE, note_bytes, 4), symtab, strtab,
            TailSection(MARKER_SECTION, SHT_NOTE, _marker_note(marker), 4)]
    rw = Rewrite(layout, tuple(patches), tuple(alloc), tuple(tail), renames, hdr_addr)
    return write(image, rw)


def restore_image(image: ElfImage) -> bytes:
    """The original file of a rewritten one, byte for byte (checked against its sha256)."""
    doc = marker_of(image)
    if doc is None:
        raise UnsupportedError("not rewritten by usdtpatch (no .note.usdtpatch marker)")
    try:
        size = int(doc["original_size"])  # type: ignore[call-overload]
        header = bytes.fromhex(str(doc["elf_header"]))
        patches = [(int(off), bytes.fromhex(str(raw)))
                   for off, raw in doc["patches"]]  # type: ignore[attr-defined]
        want = str(doc["original_sha256"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedError(f"{MARKER_SECTION} is damaged: {exc}") from exc
    if size > len(image.data):
        raise UnsupportedError(f"the marker says the original had {size} bytes, more than "
                               f"this file ({len(image.data)})")
    out = bytearray(image.data[:size])
    out[: len(header)] = header
    for off, raw in patches:
        out[off : off + len(raw)] = raw
    if hashlib.sha256(out).hexdigest() != want:
        raise UnsupportedError("restoring would not give the original back (sha256 differs): "
                               "the file was changed after the rewrite")
    return bytes(out)
