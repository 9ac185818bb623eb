"""`usdtpatch rewrite --tree DIR`: the ELF files with probes under an install root.

A distribution's package build installs into a staged tree (debian/<package>/, rpm's
buildroot) and rewrites it as a whole, before strip and debug-info extraction
(docs/distributions.md). This module finds the files; cli/cmd_rewrite.py rewrites them in
place, in parallel (-j: usdtpatch.api.rewrite_files), with the same per-file step as
`rewrite --in-place`.

- Only regular files are looked at: a symbolic link is never followed (neither a link to a
  file nor to a folder, inside the tree or out of it); the tree's own name may be a link.
- Each file is counted once: names of one inode (hard links) are one file, rewritten once
  and given back to every one of its names in the tree (`rewrite_linked`).
- A file without probes, a file that is not ELF, and a file that carries usdtpatch's marker
  (rewritten before) are never written: content and mtime stay as they are.
- Before anything is rewritten, every file to rewrite is checked to be replaceable (its folder
  writable, for the rename; the file neither immutable nor append-only): one line for each one
  that is not, and nothing is rewritten. A write that fails all the same (the disk full, a
  race) is an exit status 2 too, with that file left whole as it was.

It reads and writes through the public API only (api.load, api.marked, api.rewrite_bytes).

Deferred imports, when a tree is scanned or rewritten: dataclasses, fcntl and struct.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from typing import Any

from usdtpatch import api
from usdtpatch.api import InputError, OutputError, UsdtpatchError

ELF_MAGIC = b"\x7fELF"
# The kernel generation a tree is rewritten for when neither --form nor --kernel is given: the
# library's default target (docs/rewrite.md, "Which generation"). A package is built on one
# machine and runs on many: the build host's kernel is no guide.
TREE_KERNEL = api.DEFAULT_KERNEL


@dataclass(frozen=True, slots=True)
class TreeFile:
    """One file to rewrite: the name it is rewritten by, its other names in the tree (hard
    links), and how many names it has outside the tree (they keep the original)."""

    path: str
    links: tuple[str, ...] = ()
    outside: int = 0


@dataclass(slots=True)
class TreeScan:
    """What a tree holds: the files to rewrite, the ones rewritten before (by name), how many
    files are ELF without probes, and the ELF files that could not be read (name, why)."""

    root: str
    todo: list[TreeFile] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)
    regular: int = 0  # regular files (each inode once)
    elf: int = 0
    no_probes: int = 0
    unreadable: list[tuple[str, str]] = field(default_factory=list)


def _is_elf(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return os.read(fd, 4) == ELF_MAGIC
    finally:
        os.close(fd)


def _probes_and_marker(path: str) -> tuple[int, bool]:
    """The number of probes of an ELF file and whether it carries usdtpatch's marker."""
    probes = api.load(path, mapped=True)
    return len(probes.probes), api.marked(probes)


def scan_tree(root: str) -> TreeScan:
    """Every regular file under `root`, without following a symbolic link, in name order
    (so that the name a hard-linked file is rewritten by is the same run after run)."""
    if not os.path.isdir(root):
        why = "no such folder" if not os.path.lexists(root) else "not a folder"
        raise InputError(f"{root}: {why}; --tree takes the root of an installed tree")
    names: dict[tuple[int, int], list[str]] = {}
    nlink: dict[tuple[int, int], int] = {}

    def walk_error(exc: OSError) -> None:
        raise InputError(f"{exc.filename}: cannot read the folder: {exc.strerror or exc}")

    for folder, dirs, files in os.walk(root, onerror=walk_error):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(folder, name)
            st = os.lstat(p)
            if not stat.S_ISREG(st.st_mode):  # symbolic links (to files) and the like
                continue
            key = (st.st_dev, st.st_ino)
            names.setdefault(key, []).append(p)
            nlink[key] = st.st_nlink
    scan = TreeScan(root)
    for key, paths in names.items():
        scan.regular += 1
        first = paths[0]
        if not _is_elf(first):
            continue
        scan.elf += 1
        try:
            count, marked = _probes_and_marker(first)
        except UsdtpatchError as exc:
            scan.unreadable.append((first, str(exc)))
            continue
        if count == 0:
            scan.no_probes += 1
        elif marked:
            scan.rewritten.append(first)
        else:
            scan.todo.append(TreeFile(first, tuple(paths[1:]), nlink[key] - len(paths)))
    return scan


# linux/fs.h: FS_IOC_GETFLAGS, and the attributes that forbid replacing a file even for root
_FS_IOC_GETFLAGS = 0x80086601
_FS_IMMUTABLE_FL = 0x10
_FS_APPEND_FL = 0x20


def _pinned(path: str) -> str | None:
    """"immutable" or "append-only" when the file has that attribute (chattr +i, +a): no
    rename may replace it; None otherwise, or where the file system has no such flags."""
    import fcntl
    import struct

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 4))[0]
    except OSError:
        return None
    finally:
        os.close(fd)
    return "immutable" if flags & _FS_IMMUTABLE_FL else \
        "append-only" if flags & _FS_APPEND_FL else None


def unwritable(files: list[TreeFile]) -> list[str]:
    """A line for each file that cannot be replaced: its folder (or a link's) is not
    writable for this process, or the file is immutable or append-only."""
    lines = []
    for f in files:
        for p in (f.path, *f.links):
            folder = os.path.dirname(p) or "."
            if not os.access(folder, os.W_OK | os.X_OK, effective_ids=True):
                lines.append(f"{p}: cannot write: its folder {folder} is not writable; "
                             f"nothing was rewritten")
            elif (attr := _pinned(p)) is not None:
                lines.append(f"{p}: cannot write: the file is {attr} (chattr); nothing was "
                             f"rewritten")
    return lines


def rewrite_linked(f: TreeFile, options: dict[str, Any]) -> Any:
    """Rewrite a file with several names in the tree once, then put the new file at every
    name (each by one rename, hard-linked to the others as before); the outcome.

    `options`: api.rewrite's keyword arguments (without `in_place`)."""
    folder, name = os.path.split(f.path)
    tmp = os.path.join(folder, f".{name}.usdtpatch-tree-{os.getpid()}")
    made: list[str] = []
    try:
        r = api.rewrite_bytes(f.path, tmp, **options)
        o = r.outcome
        if not o.changed or r.data is None:
            return _named(o, f.path)
        r.write()
        made.append(tmp)
        for p in (*f.links, f.path):
            d, n = os.path.split(p)
            step = os.path.join(d, f".{n}.usdtpatch-link-{os.getpid()}")
            os.link(tmp, step)
            made.append(step)
            os.rename(step, p)
            made.remove(step)
        return _named(o, f.path)
    except OSError as exc:
        raise OutputError(f"{f.path}: cannot write: {exc.strerror or exc}") from exc
    finally:
        for p in made:
            with contextlib.suppress(OSError):
                os.unlink(p)


def _named(o: Any, path: str) -> Any:
    """The outcome with its output the file's own name (not the temporary one)."""
    from dataclasses import replace

    return replace(o, output=path)


__all__ = ["TREE_KERNEL", "TreeFile", "TreeScan", "rewrite_linked", "scan_tree", "unwritable"]
