"""Whether a process running a file may fork a copy of itself, and by which route: the one
place both `check` (`process-can-fork`, analysis/check.py) and `rewrite` (whether
`--fork-guard auto` adds the guard, usdtpatch.forkguard) ask (docs/fork-guard.md).

Routes, in the order they are asked:
- "calls": the file imports (a static file: defines) a call of the fork family that copies the
  address space (fork, _Fork, clone, daemon, forkpty, ...);
- "shared": it is a shared object (whatever process loads it may fork);
- "libraries": a dynamically linked executable needs a library other than the C library's own
  objects and the compiler's run time, or calls dlopen: such a library may fork the process,
  and the child runs this file's code;
- "lookup": a dynamically linked executable imports dlsym or dlvsym: a function it looks up
  may fork;
- "code": no symbol names a fork, and the code has a fork system call or one whose number
  it does not fix (usdtpatch.analysis.hazards.fork_evidence).

vfork, posix_spawn, system and popen are not counted: their child runs in the parent's
address space, trampoline included, until it execs.
"""

from __future__ import annotations

from dataclasses import dataclass

from usdtpatch.analysis.guardfile import c_library, needed_objects, object_kind
from usdtpatch.analysis.hazards import (
    FORK_COPIES_MM,
    ForkEvidence,
    fork_evidence_of,
    imported_fork_family,
)
from usdtpatch.elf.dynsym import defined_function_count
from usdtpatch.elf.image import ElfImage
from usdtpatch.elf.model import DT_PREINIT_ARRAY, dynamic_entries
from usdtpatch.elf.relocs import import_slots
from usdtpatch.elf.symbols import symbol_names, symbol_value

# Shared objects that never fork a copy of the process by themselves: the C library's own
# objects (their fork is a call the executable imports, counted above) and the compiler's
# run-time libraries. Any other library an executable needs may fork it (libvirt's virFork,
# a plugin host), and the child then runs the executable's code.
NON_FORKING_LIBRARIES = frozenset({
    "libc.so.6", "ld-linux-x86-64.so.2", "libm.so.6", "libmvec.so.1", "libpthread.so.0",
    "libdl.so.2", "librt.so.1", "libresolv.so.2", "libutil.so.1", "libanl.so.1",
    "libstdc++.so.6", "libgcc_s.so.1", "libatomic.so.1",
    "libc.so", "libc.musl-x86_64.so.1"})  # musl's C library (Debian's musl-gcc, Alpine)

# the run-time lookups: a pointer they return may be a fork function's
LOOKUPS = ("dlsym", "dlvsym")


@dataclass(frozen=True, slots=True)
class Exposure:
    """Why a process running the file may fork a copy of itself: `route` (the module's
    docstring lists them) and `reason`, in words."""

    route: str
    reason: str


def exposure(image: ElfImage) -> Exposure | None:
    """How a process running `image` may fork a copy of itself (None: it cannot, as far as
    the file tells). A system call whose number the code does not fix counts ("code"):
    check reports it as `fork-unknown`."""

    kind = object_kind(image)
    calls = [f for f in imported_fork_family(image) if f in FORK_COPIES_MM]
    if not calls and kind == "static":
        # a static PIE also has a .dynsym (for its self-relocation): look at what it defines
        calls = sorted(f for f in FORK_COPIES_MM if symbol_value(image, f) is not None)
    if calls:
        return Exposure("calls", f"it calls {', '.join(calls)}")
    if kind == "shared":
        return Exposure("shared", "it is a shared object (the process that loads it may fork)")
    libraries = libraries_that_may_fork(image)
    if libraries is not None:
        return Exposure("libraries", libraries)
    looks = sorted(n for n in LOOKUPS if import_slots(image, n))
    if looks and kind == "exe":
        return Exposure("lookup", f"it calls {looks[0]}: a function it looks up may fork the "
                                  f"process")
    if not any(f in FORK_COPIES_MM for f in imported_fork_family(image)):
        # no symbol names a fork (a stripped static executable, a raw system call): the code
        ev = evidence(image, True)
        why = ev.describe() or ev.uncertainty()
        if why is not None:
            return Exposure("code", why)
    return None


def fork_exposure(image: ElfImage) -> str | None:
    """`exposure(image)`'s reason, or None."""
    got = exposure(image)
    return got.reason if got is not None else None


def libraries_that_may_fork(image: ElfImage) -> str | None:
    """Why a dynamically linked executable that names no fork may still fork through what it
    loads (None: it loads only NON_FORKING_LIBRARIES and calls no dlopen): the atfork handler
    the guard registers runs for a fork() made by any object of the process."""
    if object_kind(image) != "exe":
        return None
    others = [n for n in needed_objects(image) if n not in NON_FORKING_LIBRARIES]
    if others:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        return (f"it loads {', '.join(others[:3])}{more}, which may fork the process (the "
                f"child runs this file's code)")
    opens = sorted({n for n in symbol_names(image) if n in ("dlopen", "dlmopen")})
    if opens:
        return f"it calls {opens[0]}: a library it loads may fork the process"
    return None


_LAST_EVIDENCE: list[tuple[ElfImage, bool, ForkEvidence]] = []  # the last file's, kept


def evidence(image: ElfImage, raw: bool) -> ForkEvidence:
    """usdtpatch.analysis.hazards.fork_evidence_of(image, raw), for the last file asked
    about remembered (check and rewrite ask several times about one file)."""

    for img, r, ev in _LAST_EVIDENCE:
        if img is image and r == raw:
            return ev
    got = fork_evidence_of(image, raw)
    _LAST_EVIDENCE[:] = [*_LAST_EVIDENCE[-1:], (image, raw, got)]
    return got


# --- a fork in a library's constructor that calls back into the executable -----------------

def constructor_route(image: ElfImage) -> str | None:
    """Why a fork may happen before a glibc executable's first init function runs, in code of
    its own that the guard must cover: it has no DT_PREINIT_ARRAY (whose first function glibc
    runs before every library's constructor; the guard hooks it when there is one), it needs
    a library that may fork (not one of NON_FORKING_LIBRARIES), whose constructor glibc runs
    before the executable's DT_INIT and init array, and it exports functions such a
    constructor can call (defined STT_FUNC / STT_GNU_IFUNC symbols of its `.dynsym`). None
    when no such route exists (the guard's first init array entry is then early enough)."""
    if object_kind(image) != "exe" or c_library(image) != "glibc":
        return None
    dyn = dynamic_entries(image)
    if any(t == DT_PREINIT_ARRAY for t, _v, _o in dyn):
        return None
    others = [n for n in needed_objects(image) if n not in NON_FORKING_LIBRARIES]
    exported = defined_function_count(image)
    if not others or not exported:
        return None
    return (f"the constructor of a library it loads ({others[0]}) runs before this "
            f"executable's initializers and may call one of the {exported} function(s) it "
            f"exports, which may fork")
