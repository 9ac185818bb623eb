"""The fork guard as a file carries it: whether there is one and the sites its table lists
(what `check` and `verify` read), and the kind of object the file is. Nothing here analyses
code: usdtpatch.forkguard (the builder) and usdtpatch.analysis both use this module, which
uses neither."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from usdtpatch.elf.image import ET_DYN, ET_EXEC, PT_INTERP, ElfImage
from usdtpatch.elf.marker import marker_of
from usdtpatch.elf.model import (
    DF_1_PIE,
    DT_FLAGS_1,
    DT_NEEDED,
    DT_STRSZ,
    DT_STRTAB,
    dynamic_entries,
)
from usdtpatch.elf.symbols import symbol_value
from usdtpatch.errors import UnsupportedError, UsdtpatchError

ENTRY_SIZE = 12
TABLE_SECTION = "__usdtpatch_fork_sites"  # sys/sdt.h's table


class GuardUnsupported(UnsupportedError):
    """The file cannot carry the fork guard; the message says why."""



def is_shared(image: ElfImage) -> bool:
    """Whether `image` is a shared object (not an executable, static or dynamic)."""
    return object_kind(image) == "shared"


def object_kind(image: ElfImage) -> str:
    """"exe" (dynamically linked executable), "shared" (shared object), "static" (static
    executable, PIE or not) or "other"."""
    if image.type not in (ET_EXEC, ET_DYN):
        return "other"
    if any(s.type == PT_INTERP for s in image.segments):
        return "exe"
    dyn = dynamic_entries(image)
    if not dyn:
        return "static"
    flags1 = next((v for t, v, _o in dyn if t == DT_FLAGS_1), 0)
    if image.type == ET_EXEC or flags1 & DF_1_PIE:
        return "static"  # a static PIE relocates itself: it has a .dynamic and no interpreter
    return "shared"


def needed_objects(image: ElfImage) -> tuple[str, ...]:
    """The DT_NEEDED names of a dynamically linked file, in order (a name the file's
    dynamic string table does not hold whole is given as "?")."""
    dyn = dynamic_entries(image)
    tags = {t: v for t, v, _o in dyn}
    strtab, strsz = tags.get(DT_STRTAB), tags.get(DT_STRSZ, 0)
    out: list[str] = []
    for t, v, _o in dyn:
        if t != DT_NEEDED:
            continue
        raw = image.read_vaddr(strtab + v, min(256, max(0, strsz - v))) \
            if strtab is not None and v < strsz else b""
        end = raw.find(b"\0")
        out.append(raw[:end].decode("utf-8", "replace") if end > 0 else "?")
    return tuple(out)


def c_library(image: ElfImage) -> str:
    """The C library the file runs with: "glibc", "musl", or a description of another one
    ("the C library of /lib/ld-uClibc.so.0", "an unknown C library"). A dynamically linked
    executable by its interpreter, a shared object by the C library it needs, a static
    executable by glibc's ABI note (crt1.o's `.note.ABI-tag`) or musl's `__init_libc`."""
    interp = next((sg for sg in image.segments if sg.type == PT_INTERP), None)
    if interp is not None:
        raw = bytes(image.data[interp.offset:interp.offset + min(interp.filesz, 256)])
        path = raw.split(b"\0")[0].decode("utf-8", "replace")
        name = path.rsplit("/", 1)[-1]
        if name == "ld-linux-x86-64.so.2":  # glibc
            return "glibc"
        if name.startswith("ld-musl-"):
            return "musl"
        return f"the C library of {path}"
    kind = object_kind(image)
    if kind == "shared":
        needed = needed_objects(image)
        if "libc.so.6" in needed:
            return "glibc"
        if "libc.so" in needed or any(n.startswith("libc.musl-") for n in needed):
            return "musl"
        libc = [n for n in needed if n.startswith("libc.")]
        # one that needs no C library runs with the process's: the guard registers with
        # glibc's __register_atfork when it finds it (docs/fork-guard.md, What remains)
        return f"the C library {libc[0]}" if libc else "glibc"
    if image.section(".note.ABI-tag") is not None:
        return "glibc"
    if symbol_value(image, "__init_libc") is not None:
        return "musl"
    return "an unknown C library"


@dataclass(frozen=True, slots=True)
class TableEntry:
    entry: int  # the entry's address
    site: int
    orig: bytes


def read_table(image: ElfImage, start: int, end: int) -> tuple[TableEntry, ...]:
    """The entries of a site table in [start, end) (empty entries left out)."""
    raw = image.read_vaddr(start, end - start)
    if len(raw) != end - start or (end - start) % ENTRY_SIZE:
        raise GuardUnsupported(f"site table [{start:#x}, {end:#x}) is not in the file")
    out = []
    for i in range(0, len(raw), ENTRY_SIZE):
        (rel,) = struct.unpack_from("<i", raw, i)
        if rel:
            out.append(TableEntry(start + i, start + i + rel, raw[i + 4: i + 9]))
    return tuple(out)


def header_table(image: ElfImage) -> tuple[TableEntry, ...] | None:
    """The fork-guard table sys/sdt.h left in a file (None: the file has none)."""
    sec = image.section(TABLE_SECTION)
    if sec is None or not sec.allocated:
        return None
    return read_table(image, sec.addr, sec.addr + sec.size)


@dataclass(frozen=True, slots=True)
class Coverage:
    """The fork guard a file carries: which of its sites it covers and how it registers."""

    kind: str  # "sdt.h" (built with usdtpatch's header) or "rewrite" (added by rewrite)
    sites: frozenset[int]
    how: str


def coverage(image: ElfImage) -> Coverage | None:
    """The fork guard of `image`, or None when it has none (or it cannot be read)."""
    try:
        return _coverage(image)
    except (UsdtpatchError, struct.error, ValueError):
        return None


def _coverage(image: ElfImage) -> Coverage | None:
    table = header_table(image)
    if table is not None:
        return Coverage("sdt.h", frozenset(e.site for e in table),
                        "sys/sdt.h's constructor registers it with pthread_atfork")
    try:
        marker = marker_of(image)
    except UnsupportedError:
        return None
    fg = marker.get("fork_guard") if marker is not None else None
    if not isinstance(fg, dict):
        return None
    span = fg.get("table")
    hook = fg.get("hook")
    if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span)):
        return None
    try:
        entries = read_table(image, span[0], span[1])
    except GuardUnsupported:
        return None
    return Coverage("rewrite", frozenset(e.site for e in entries),
                    f"usdtpatch rewrite added it ({hook})")
