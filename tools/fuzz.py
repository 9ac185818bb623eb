"""A mutation corpus over every command: `python -m tools.fuzz [--count N] [--seed S]`.

Each mutant is a fixture (or a rewritten fixture) with a few deterministic damages: flipped
bytes in the ELF header, the program or section headers, the SDT notes, `.eh_frame` and
`.eh_frame_hdr`, the code around a probe, the restore marker; truncations; header and note
size fields set to huge values; two notes at one pc; invalid UTF-8 in a note; a second
section named `.note.stapsdt`. Mutant `i` of seed `s` depends on nothing else, so one mutant
can be made again (`--only i --keep DIR`).

Every mutant goes through every command in-process (list, check, show, rewrite without and
with verification, restore, plan, verify), each in a fresh folder with its own copy of the
input. What must hold (anything else is a problem, printed with the mutant's id):

- exit status 0, 1 or 2; never 3 (internal error), never a traceback, never a hang (each
  command has `--timeout` seconds), never more than 1 GiB of resident memory;
- exit 2 is one line, `usdtpatch: ...`, naming the input file;
- the input is unchanged (sha256), and the folder holds nothing but the input and the
  command's output: no temp file, and no output at all after a refusal;
- a written rewrite output is re-read by binutils readelf with no complaint that the input did
  not already draw, passes usdtpatch.elf.validate, and `restore` gives the input back byte
  for byte; a restored file is the original the rewritten fixture came from.

Prints the number of runs per command and exit status, then the problems; `--json` prints
the same as one JSON document. Exit status 1 when there is a problem.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "bin"

# The bases: small fixtures that cover PIE, non-PIE, a shared library, static, stripped,
# prelinked notes, semaphores, C++ exception tables, every argument shape, in-place forms,
# nop5 sites, foreign architectures; the first group is also rewritten to make bases for
# `restore` and for "already rewritten" inputs.
REWRITTEN_BASES = ["pie", "libprobes.so", "cxx-throw", "args-O2", "sema-dtrace", "prelinked"]
PLAIN_BASES = [*REWRITTEN_BASES, "nopie", "static", "stripped", "args-clang", "dtrace-G5",
               "padded", "branch-after", "riprel-after", "nop5", "combo10", "adjacent",
               "redzone-leaf", "odd-note", "bad-args", "i386", "aarch64", "bigendian",
               "noprobes"]

COMMANDS = ["list", "check", "show", "rewrite", "rewrite-verify", "restore", "plan", "verify"]
HUGE = [0, 1, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, 1 << 40,
        1 << 63, (1 << 64) - 1]

# (offset, struct format) of the ELF header fields worth damaging, per class
_EHDR = {
    64: {"e_type": (16, "H"), "e_machine": (18, "H"), "e_entry": (24, "Q"),
         "e_phoff": (32, "Q"), "e_shoff": (40, "Q"), "e_phentsize": (54, "H"),
         "e_phnum": (56, "H"), "e_shentsize": (58, "H"), "e_shnum": (60, "H"),
         "e_shstrndx": (62, "H")},
    32: {"e_type": (16, "H"), "e_machine": (18, "H"), "e_entry": (24, "I"),
         "e_phoff": (28, "I"), "e_shoff": (32, "I"), "e_phentsize": (42, "H"),
         "e_phnum": (44, "H"), "e_shentsize": (46, "H"), "e_shnum": (48, "H"),
         "e_shstrndx": (50, "H")},
}
_PHDR = {
    64: {"p_type": (0, "I"), "p_flags": (4, "I"), "p_offset": (8, "Q"), "p_vaddr": (16, "Q"),
         "p_filesz": (32, "Q"), "p_memsz": (40, "Q"), "p_align": (48, "Q")},
    32: {"p_type": (0, "I"), "p_offset": (4, "I"), "p_vaddr": (8, "I"), "p_filesz": (16, "I"),
         "p_memsz": (20, "I"), "p_flags": (24, "I"), "p_align": (28, "I")},
}
_SHDR = {
    64: {"sh_name": (0, "I"), "sh_type": (4, "I"), "sh_flags": (8, "Q"), "sh_addr": (16, "Q"),
         "sh_offset": (24, "Q"), "sh_size": (32, "Q"), "sh_link": (40, "I"),
         "sh_info": (44, "I"), "sh_entsize": (56, "Q")},
    32: {"sh_name": (0, "I"), "sh_type": (4, "I"), "sh_flags": (8, "I"), "sh_addr": (12, "I"),
         "sh_offset": (16, "I"), "sh_size": (20, "I"), "sh_link": (24, "I"),
         "sh_info": (28, "I"), "sh_entsize": (36, "I")},
}


# --- the bases ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    name: str  # file name the mutants get
    data: bytes
    original: bytes | None  # for a rewritten base: the fixture it came from
    probe: str  # provider:name for `show`
    regions: dict[str, tuple[int, int]]  # name -> (offset, size) in the file
    fields: list[tuple[str, int, str]]  # (what, offset, struct format incl. byte order)
    notes: list[tuple[int, int, int]]  # each SDT note: (pc offset, pc size, strings offset)
    note_headers: list[int]  # file offset of each note header in .note.stapsdt
    note_name_sh: int | None  # file offset of .note.stapsdt's sh_name, and its value
    note_name_value: int
    shdr_offsets: list[int]  # file offset of every section header
    # (file offset of the section header, the section's bytes) of .note.stapsdt and
    # .note.usdtpatch, for the hostile shapes that put a new copy at the end of the file
    note_sections: dict[str, tuple[int, bytes]] = field(default_factory=dict)


def _describe(name: str, data: bytes, original: bytes | None) -> Base:
    from usdtpatch.elf.image import parse_elf
    from usdtpatch.elf.notes import SdtNote, parse_notes

    image = parse_elf(data)
    cls = 64 if image.is64 else 32
    bo = image.byteorder
    regions: dict[str, tuple[int, int]] = {"ehdr": (0, 64 if cls == 64 else 52)}
    phsize = struct.calcsize(bo + ("IIQQQQQQ" if cls == 64 else "IIIIIIII"))
    shsize = struct.calcsize(bo + ("IIQQQQIIQQ" if cls == 64 else "IIIIIIIIII"))
    if image.segments:
        regions["phdrs"] = (image.phoff, len(image.segments) * phsize)
    if image.sections:
        regions["shdrs"] = (image.shoff, len(image.sections) * shsize)
    for sec in image.sections:
        if sec.name in (".note.stapsdt", ".eh_frame", ".eh_frame_hdr", ".note.usdtpatch",
                        ".symtab", ".dynsym", ".gcc_except_table", ".stapsdt.base",
                        ".probes", ".dynamic", ".rela.dyn", ".rodata", ".text",
                        ".init_array") and sec.type != 8 and sec.size:
            regions[sec.name] = (sec.offset, sec.size)
    fields: list[tuple[str, int, str]] = []
    for what, (off, fmt) in _EHDR[cls].items():
        fields.append((what, off, bo + fmt))
    for seg in image.segments:
        for what, (off, fmt) in _PHDR[cls].items():
            fields.append((f"phdr[{seg.index}].{what}", image.phoff + seg.index * phsize + off,
                           bo + fmt))
    shdr_offsets = [image.shoff + s.index * shsize for s in image.sections]
    for sec in image.sections:
        for what, (off, fmt) in _SHDR[cls].items():
            fields.append((f"shdr[{sec.index}:{sec.name}].{what}", shdr_offsets[sec.index] + off,
                           bo + fmt))
    notes: list[tuple[int, int, int]] = []
    headers: list[int] = []
    note_sh: int | None = None
    note_name = 0
    probe = "none:none"
    nsec = image.section(".note.stapsdt")
    if nsec is not None and nsec.type != 8:
        note_sh = shdr_offsets[nsec.index]
        note_name = struct.unpack_from(bo + "I", data, note_sh)[0]
        ws = image.word_size
        for n in parse_notes(image.section_data(nsec), ws, bo).notes:
            headers.append(nsec.offset + n.offset)
            if isinstance(n, SdtNote):
                desc = nsec.offset + n.offset + 12 + 8  # header, "stapsdt\0"
                notes.append((desc, ws, desc + 3 * ws))
                if probe == "none:none":
                    probe = n.probe_id
        # the code around each probe (the patch window and what follows)
        for k, (pc_at, _, _) in enumerate(notes):
            site = image.vaddr_to_offset(
                struct.unpack_from(bo + ("Q" if ws == 8 else "I"), data, pc_at)[0])
            if site is not None:
                regions["site" if k == 0 else f"site{k}"] = (max(0, site - 8), 40)
    note_sections = {sec.name: (shdr_offsets[sec.index], image.section_data(sec))
                     for sec in image.sections
                     if sec.name in (".note.stapsdt", ".note.usdtpatch") and sec.type != 8
                     and sec.offset + sec.size <= len(data)}
    return Base(name, data, original, probe, regions, fields, notes, headers, note_sh,
                note_name, shdr_offsets, note_sections)


def load_bases(files: Sequence[Path] = ()) -> list[Base]:
    """Every base, built once: the plain fixtures and rewritten copies of some; or `files`
    (other ELF files, e.g. a real library: read only) and their rewritten copies."""
    from usdtpatch.elf.image import parse_elf
    from usdtpatch.rewriter.build import build_rewrite
    from usdtpatch.rewriter.plan import plan_rewrite

    plain = [(p.name, p) for p in files] if files else \
        [(n, FIXTURES / n) for n in PLAIN_BASES]
    rewritten = plain if files else [(n, FIXTURES / n) for n in REWRITTEN_BASES]
    bases = []
    for name, path in plain:
        if path.is_file():
            bases.append(_describe(name, path.read_bytes(), None))
    for name, path in rewritten:
        if not path.is_file():
            continue
        data = path.read_bytes()
        rp = plan_rewrite(parse_elf(data), verify=None)
        if rp.changed:
            bases.append(_describe(f"{name}.rewritten", build_rewrite(rp), data))
    return bases


# --- mutations ----------------------------------------------------------------------------


def _flip(rng: random.Random, buf: bytearray, start: int, size: int) -> str:
    size = max(1, min(size, len(buf) - start))
    spots = []
    for _ in range(rng.randint(1, 4)):
        at = start + rng.randrange(size)
        if at < len(buf):
            buf[at] ^= rng.randint(1, 255)
            spots.append(f"{at:#x}")
    return ",".join(spots)


def _put(buf: bytearray, off: int, fmt: str, value: int) -> bool:
    width = struct.calcsize(fmt)
    if off + width > len(buf):
        return False
    struct.pack_into(fmt, buf, off, value & ((1 << (8 * width)) - 1))
    return True


# Hostile shapes (issue 20): a note argument with a number of 5,000 digits (int() refuses
# more than 4,300), a restore marker nested 100,000 deep (json recurses per level).
LONG_NUMBER = "9" * 5000
DEEP_JSON = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _repoint(base: Base, buf: bytearray, name: str, content: bytes) -> bool:
    """Put `content` at the end of `buf` as the new bytes of section `name` (its header's
    sh_offset and sh_size repointed; the old bytes stay where they were)."""
    if name not in base.note_sections or buf[4] != 2:
        return False
    shdr, _ = base.note_sections[name]
    fmt = "<QQ" if buf[5] == 1 else ">QQ"
    if shdr + 40 > len(buf):
        return False
    buf += b"\0" * ((-len(buf)) % 8)
    struct.pack_into(fmt, buf, shdr + 24, len(buf), len(content))
    buf += content
    return True


def _hostile(rng: random.Random, base: Base, buf: bytearray) -> str | None:
    from dataclasses import replace

    from usdtpatch.elf.marker import MARKER_OWNER, MARKER_TYPE
    from usdtpatch.elf.notes import SdtNote, make_note, parse_notes, serialize_notes

    kind = rng.choice(["long-number", "deep-marker"])
    if kind == "deep-marker" and ".note.usdtpatch" in base.note_sections and _repoint(
            base, buf, ".note.usdtpatch", make_note(MARKER_OWNER, MARKER_TYPE, DEEP_JSON)):
        return "marker nested 100,000 deep"
    if ".note.stapsdt" not in base.note_sections or buf[4] != 2:
        return None
    bo = "<" if buf[5] == 1 else ">"
    section = parse_notes(base.note_sections[".note.stapsdt"][1], 8, bo)
    sdt = [i for i, n in enumerate(section.notes) if isinstance(n, SdtNote)]
    if not sdt:
        return None
    k = rng.choice(sdt)
    note = section.notes[k]
    assert isinstance(note, SdtNote)
    shape = rng.choice([f"{LONG_NUMBER}@%rax", f"-4@${LONG_NUMBER}", f"-4@{LONG_NUMBER}(%rbp)",
                        f"8@$0x{'f' * 5000}", f"-8@-{LONG_NUMBER}+sym(%rip)"])
    args = " ".join(filter(None, [note.args, shape]))
    changed = replace(note, args=args)
    notes = tuple(changed if i == k else n for i, n in enumerate(section.notes))
    if _repoint(base, buf, ".note.stapsdt",
                serialize_notes(replace(section, notes=notes), 8, bo)):
        return f"note {k} gets a 5,000-digit argument {shape[:12]}..."
    return None


def _mutate_once(rng: random.Random, base: Base, buf: bytearray) -> str:
    ops = ["flip", "flip", "flip", "huge", "huge", "trunc", "note", "hostile"]
    op = rng.choice(ops)
    if op == "hostile":
        said = _hostile(rng, base, buf)
        if said is not None:
            return said
        op = "flip"
    if op == "flip":
        region = rng.choice([*sorted(base.regions), "anywhere"])
        start, size = base.regions.get(region, (0, len(buf)))
        if region in (".eh_frame", ".note.stapsdt") and rng.random() < 0.5:
            size = min(size, 48)  # the first CIE and its augmentation; the first note
        return f"flip {region} at {_flip(rng, buf, start, size)}"
    if op == "huge":
        what, off, fmt = rng.choice(base.fields)
        value = rng.choice([*HUGE, len(buf), len(buf) + 1, len(buf) - 1, len(buf) // 2])
        if _put(buf, off, fmt, value):
            return f"{what}={value:#x}"
        return "nothing"
    if op == "trunc":
        cut = rng.choice([rng.randrange(max(1, min(len(buf), 4096))),
                          rng.randrange(max(1, len(buf)))])
        if base.shdr_offsets and rng.random() < 0.3:
            cut = rng.choice(base.shdr_offsets) + rng.randrange(64)
        del buf[cut:]
        return f"truncate at {cut:#x}"
    # note-level damages
    kind = rng.choice(["dup-pc", "utf8", "size", "second-section", "move-pc"])
    if kind == "move-pc" and base.notes:
        at, width, _ = rng.choice(base.notes)
        fmt = ("<" if buf[5] == 1 else ">") + ("Q" if width == 8 else "I")
        if at + width <= len(buf):
            delta = rng.choice([-16, -5, -4, -1, 1, 2, 3, 4, 5, 8, 64, 4096, -4096])
            pc = struct.unpack_from(fmt, buf, at)[0]
            if _put(buf, at, fmt, pc + delta):
                return f"note pc at {at:#x} moved by {delta}"
    if kind == "dup-pc" and len(base.notes) >= 2:
        a, b = rng.sample(range(len(base.notes)), 2)
        src, dst = base.notes[a][0], base.notes[b][0]
        width = base.notes[a][1]
        if max(src, dst) + width <= len(buf):
            buf[dst : dst + width] = buf[src : src + width]
            return f"note {b} gets note {a}'s pc"
    if kind == "utf8" and base.notes:
        _, _, strings = rng.choice(base.notes)
        at = strings + rng.randrange(6)
        if at < len(buf):
            buf[at] = rng.choice([0x80, 0xC3, 0xE2, 0xFF])
            return f"invalid UTF-8 at {at:#x}"
    if kind == "size" and base.note_headers:
        at = rng.choice(base.note_headers) + rng.choice([0, 4])
        value = rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 0x10000, 3, 0])
        fmt = "<I" if buf[5] == 1 else ">I"
        if _put(buf, at, fmt, value):
            return f"note header field at {at:#x}={value:#x}"
    if kind == "second-section" and base.note_name_sh is not None and base.shdr_offsets:
        victim = rng.choice(base.shdr_offsets[1:] or base.shdr_offsets)
        fmt = "<I" if buf[5] == 1 else ">I"
        if _put(buf, victim, fmt, base.note_name_value):
            return f"section header at {victim:#x} renamed .note.stapsdt"
    return f"flip anywhere at {_flip(rng, buf, 0, len(buf))}"


@dataclass(frozen=True)
class Mutant:
    index: int
    base: Base
    data: bytes
    how: str

    @property
    def id(self) -> str:
        return f"{self.index}:{self.base.name}"


def make_mutant(bases: Sequence[Base], seed: int, index: int) -> Mutant:
    rng = random.Random(f"{seed}:{index}")
    base = rng.choice(bases)
    buf = bytearray(base.data)
    hows = [_mutate_once(rng, base, buf) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    if bytes(buf) == base.data:  # a flip that undid another: damage one more byte
        hows.append(f"flip anywhere at {_flip(rng, buf, 0, len(buf))}")
    return Mutant(index, base, bytes(buf), "; ".join(hows))


# --- running the commands -----------------------------------------------------------------


class Timeout(BaseException):
    """A command ran longer than --timeout (BaseException: main() must not catch it)."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def fire(_sig: int, _frame: FrameType | None) -> None:
        raise Timeout

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


Main = Callable[[list[str], IO[str], IO[str]], int]


def _default_main(argv: list[str], out: IO[str], err: IO[str]) -> int:
    from usdtpatch.cli import main

    return main(argv, out=out, err=err)


@dataclass
class Run:
    rc: int | str  # an exit status, or "timeout" / the exception that escaped main()
    out: str
    err: str


def _run(main: Main, argv: list[str], timeout: float) -> Run:
    out, err = io.StringIO(), io.StringIO()
    try:
        with _deadline(timeout):
            rc: int | str = main(argv, out, err)
    except Timeout:
        rc = "timeout"
    except BaseException as exc:  # anything main() let through is a bug
        if isinstance(exc, KeyboardInterrupt):
            raise
        rc = f"escaped {type(exc).__name__}: {exc}"[:300]
    return Run(rc, out.getvalue(), err.getvalue())


MEMORY_LIMIT = 1 << 30  # a command whose peak resident memory exceeds this is a problem


def _reset_peak_memory() -> bool:
    """Reset this process's peak RSS (Linux >= 4.0: "5" into /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _memory(field: str = "VmHWM") -> int:
    """This process's peak (VmHWM, since the last reset) or current (VmRSS) resident memory
    in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _argv(command: str, path: Path, out: Path, probe: str) -> list[str]:
    p = str(path)
    return {
        "list": ["list", "--json", p],
        "check": ["check", "--json", p],
        "show": ["show", "--probe", probe, p],
        "rewrite": ["rewrite", "--no-verify", "--json", p, "-o", str(out)],
        "rewrite-verify": ["rewrite", "--json", p, "-o", str(out)],
        "restore": ["restore", p, "-o", str(out)],
        "plan": ["plan", "--json", p],
        "verify": ["verify", "--json", p],
    }[command]


_NUMBER = re.compile(r"0x[0-9a-fA-F]+|\d+")


def readelf_complaints(path: Path) -> tuple[int, set[str]]:
    """binutils readelf's exit status and its warnings and errors, numbers and the file name
    blanked (so that the input's and the output's can be compared)."""
    done = subprocess.run(["readelf", "-W", "-a", "--debug-dump=frames", str(path)],
                          capture_output=True, text=True, errors="replace", timeout=120,
                          check=False)
    lines = set()
    for line in done.stderr.splitlines():
        if "Warning" in line or "Error" in line:
            lines.add(_NUMBER.sub("#", line.replace(str(path), "FILE")))
    return done.returncode, lines


@dataclass
class Problem:
    kind: str
    mutant: str
    how: str
    command: str
    detail: str


@dataclass
class Tally:
    runs: Counter[tuple[str, str]] = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)
    mutants: int = 0
    written: int = 0  # rewrite outputs checked (readelf, validate, restore)
    restored: int = 0  # restore outputs compared with the original


def _readelf() -> bool:
    return shutil.which("readelf") is not None


def check_mutant(m: Mutant, tally: Tally, work: Path, *, main: Main = _default_main,
                 timeout: float = 60.0, commands: Sequence[str] = COMMANDS,
                 memory_limit: int = MEMORY_LIMIT) -> None:
    """Run every command on mutant `m` and add what happened to `tally`."""
    from usdtpatch.elf.validate import validate_output
    from usdtpatch.errors import OutputError

    tally.mutants += 1
    want = hashlib.sha256(m.data).hexdigest()

    def problem(kind: str, command: str, detail: str) -> None:
        tally.problems.append(Problem(kind, m.id, m.how, command, detail[:400]))

    input_complaints: tuple[int, set[str]] | None = None
    for command in commands:
        folder = work / command
        folder.mkdir(parents=True)
        path = folder / m.base.name
        path.write_bytes(m.data)
        out = folder / "out"
        measured = _reset_peak_memory()
        before = _memory("VmRSS")
        run = _run(main, _argv(command, path, out, m.base.probe), timeout)
        tally.runs[(command, str(run.rc))] += 1
        grew = _memory() - before
        if measured and grew > memory_limit:
            problem("memory", command, f"resident memory grew by {grew / (1 << 30):.1f} GiB "
                                       f"for a {len(m.data)}-byte input (exit {run.rc})")
        if not isinstance(run.rc, int) or run.rc not in (0, 1, 2):
            first = (run.err.strip().splitlines() or [""])[-1]
            problem("internal error", command, f"exit {run.rc}: {first}")
        elif "Traceback" in run.err or "Traceback" in run.out:
            problem("traceback", command, run.err[-300:])
        elif run.rc == 2:
            lines = [ln for ln in run.err.splitlines() if ln.strip()]
            if len(lines) != 1 or not lines[0].startswith("usdtpatch: "):
                problem("unclear refusal", command, repr(run.err[:300]))
            elif m.base.name not in lines[0]:
                problem("refusal without the file name", command, lines[0])
        if hashlib.sha256(path.read_bytes()).hexdigest() != want:
            problem("input changed", command, str(path))
        left = sorted(p.name for p in folder.iterdir() if p.name not in (m.base.name, "out"))
        if left:
            problem("file left behind", command, " ".join(left))
        if not out.exists():
            if command.startswith("rewrite") and run.rc in (0, 1):
                problem("no output", command, f"exit {run.rc} but {out.name} is missing")
            shutil.rmtree(folder)
            continue
        if run.rc == 2 or not isinstance(run.rc, int):
            problem("output after a refusal", command, run.err.strip()[:200])
            shutil.rmtree(folder)
            continue
        data = out.read_bytes()
        if command == "restore":
            tally.restored += 1
            if m.base.original is None or data != m.base.original:
                problem("restore gave other bytes", command,
                        f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}")
        elif data != m.data:  # a rewrite that changed the file
            tally.written += 1
            try:
                validate_output(data)
            except OutputError as exc:
                problem("damaged output", command, str(exc))
            if _readelf():
                if input_complaints is None:
                    input_complaints = readelf_complaints(path)
                rc, said = readelf_complaints(out)
                new = sorted(said - input_complaints[1])
                if new or (rc != 0 and input_complaints[0] == 0):
                    problem("damaged output", command, f"readelf exit {rc}: {new[:3]}")
            back = folder / "back"
            restored = _run(main, ["restore", str(out), "-o", str(back)], timeout)
            if restored.rc != 0 or not back.exists() or back.read_bytes() != m.data:
                problem("not restored", command,
                        f"restore exit {restored.rc}: {restored.err.strip()[:200]}")
        shutil.rmtree(folder)


# --- the command line ---------------------------------------------------------------------


def run_corpus(seed: int, count: int, *, start: int = 0, only: Sequence[int] = (),
               timeout: float = 60.0, keep: Path | None = None,
               progress: IO[str] | None = None, files: Sequence[Path] = ()) -> Tally:
    bases = load_bases(files)
    tally = Tally()
    indexes = list(only) if only else list(range(start, start + count))
    with tempfile.TemporaryDirectory(prefix="usdtpatch-fuzz-") as tmp:
        for n, i in enumerate(indexes):
            m = make_mutant(bases, seed, i)
            before = len(tally.problems)
            check_mutant(m, tally, Path(tmp) / str(i), timeout=timeout)
            shutil.rmtree(Path(tmp) / str(i), ignore_errors=True)
            if keep is not None and (len(tally.problems) > before or only):
                keep.mkdir(parents=True, exist_ok=True)
                (keep / f"{i}-{m.base.name}").write_bytes(m.data)
            if progress is not None and (n + 1) % 100 == 0:
                print(f"{n + 1}/{len(indexes)} mutants, {len(tally.problems)} problems",
                      file=progress, flush=True)
    return tally


def summary(tally: Tally, seed: int, seconds: float) -> dict[str, Any]:
    per: dict[str, dict[str, int]] = {}
    for (command, rc), n in sorted(tally.runs.items()):
        per.setdefault(command, {})[rc] = n
    kinds = Counter(p.kind for p in tally.problems)
    return {
        "seed": seed, "mutants": tally.mutants, "seconds": round(seconds, 1),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{platform.node()} {platform.machine()}, Linux {platform.release()}, "
                   f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "runs": per, "rewrite_outputs_checked": tally.written,
        "restore_outputs_checked": tally.restored,
        "problems_by_kind": dict(kinds), "problems": [asdict(p) for p in tally.problems],
    }


def render(doc: dict[str, Any]) -> str:
    codes = sorted({rc for per in doc["runs"].values() for rc in per})
    lines = [f"{doc['mutants']} mutants (seed {doc['seed']}) in {doc['seconds']} s, "
             f"{doc['date']}", doc["machine"], "",
             "command          " + "".join(f"{'exit ' + c:>12}" for c in codes)]
    for command in COMMANDS:
        per = doc["runs"].get(command, {})
        lines.append(f"{command:<17}" + "".join(f"{per.get(c, 0):>12}" for c in codes))
    lines += ["", f"rewrite outputs re-read (readelf, validate) and restored: "
                  f"{doc['rewrite_outputs_checked']}; restore outputs compared: "
                  f"{doc['restore_outputs_checked']}",
              f"problems: {len(doc['problems'])} {doc['problems_by_kind'] or ''}"]
    for p in doc["problems"]:
        lines.append(f"  [{p['kind']}] mutant {p['mutant']} ({p['how']}) {p['command']}: "
                     f"{p['detail']}")
    return "\n".join(lines)


def render_markdown(doc: dict[str, Any]) -> str:
    """The run as the Markdown docs/reliability.md shows."""
    codes = sorted({rc for per in doc["runs"].values() for rc in per})
    lines = [f"{doc['mutants']} mutants, seed {doc['seed']}, {doc['date']}, "
             f"{doc['seconds']} s on {doc['machine']}.", "",
             "| command | " + " | ".join(f"exit {c}" for c in codes) + " |",
             "|---|" + "---:|" * len(codes)]
    for command in COMMANDS:
        per = doc["runs"].get(command, {})
        lines.append(f"| `{command}` | " + " | ".join(f"{per.get(c, 0):,}" for c in codes) +
                     " |")
    kinds = doc["problems_by_kind"]
    lines += ["", f"Rewritten outputs re-read (validate, readelf) and restored byte for byte: "
                  f"{doc['rewrite_outputs_checked']:,}; restored files compared with their "
                  f"original: {doc['restore_outputs_checked']:,}.",
              "", f"Problems: {len(doc['problems'])}" +
              (" (" + ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())) + ")"
               if kinds else "") + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--start", type=int, default=0, help="first mutant index")
    ap.add_argument("--only", type=int, nargs="*", default=[], help="just these mutants")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per command")
    ap.add_argument("--keep", type=Path, help="write the mutants with problems here")
    ap.add_argument("--memory", type=int, default=0,
                    help="address space limit in GiB (0: none; unicorn reserves about 1 GiB "
                         "per emulator, so keep it generous)")
    ap.add_argument("--base", type=Path, action="append", default=[],
                    help="mutate this ELF file (read only; repeatable) instead of the fixtures")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="the summary as Markdown")
    args = ap.parse_args(argv)
    if args.memory:
        limit = args.memory << 30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a runaway allocation fails
    started = time.monotonic()
    tally = run_corpus(args.seed, args.count, start=args.start, only=args.only,
                       timeout=args.timeout, keep=args.keep,
                       progress=None if args.json else sys.stderr, files=args.base)
    doc = summary(tally, args.seed, time.monotonic() - started)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(render_markdown(doc) if args.markdown else render(doc))
    return 1 if tally.problems else 0


if __name__ == "__main__":
    sys.exit(main())
