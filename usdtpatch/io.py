"""The one helper that touches files: read an input, check and write an output atomically.

What usdtpatch promises (README, "Inputs and outputs"): an input is only read, never
executed or changed (unless --in-place names it as the output); only regular files are read
(a FIFO, a device or a socket is refused before it is opened, and a file is read up to the
size it had when it was opened; `list` maps its files instead, see map_input); an output is
a new regular file put in place by one rename, so that either the whole new content is there
or the old file is untouched; an existing output that is not a regular file (a device such
as /dev/null, a FIFO, a socket, a directory) is refused, never written through; an output
that is an input (the same file, by any spelling or link) is refused unless --in-place.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from collections.abc import Iterable

from usdtpatch.errors import InputError, OutputError

StrPath = str | os.PathLike[str]


def file_kind(mode: int) -> str:
    """What a file of st_mode `mode` is, in words."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def _stat_input(p: str) -> os.stat_result:
    try:
        return os.stat(p)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise InputError(f"{p}: no such file") from exc
    except PermissionError as exc:
        raise InputError(f"{p}: permission denied") from exc
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from exc


def _refuse_kind(p: str, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise InputError(f"{p}: is a directory, not an ELF file")
    if not stat.S_ISREG(mode):
        raise InputError(f"{p}: is {file_kind(mode)}, not a regular file")


def _open_input(p: str) -> tuple[int, int]:
    """Open a regular input file without blocking (a FIFO swapped in after the first check
    cannot hang the open) and check its kind again: (descriptor, size)."""
    _refuse_kind(p, _stat_input(p).st_mode)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except IsADirectoryError as exc:
        raise InputError(f"{p}: is a directory, not an ELF file") from exc
    except FileNotFoundError as exc:
        raise InputError(f"{p}: no such file") from exc
    except PermissionError as exc:
        raise InputError(f"{p}: permission denied") from exc
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        _refuse_kind(p, st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_input(path: StrPath) -> bytes:
    """Read a whole input file, or raise InputError with one clear sentence.

    Only regular files: the kind is checked before the file is opened and again after, and at
    most the size it had when it was opened is read.
    """
    p = os.fspath(path)
    fd, size = _open_input(p)
    try:
        return _read_all(p, fd, size)
    finally:
        os.close(fd)


def _read_all(p: str, fd: int, left: int) -> bytes:
    try:
        chunks: list[bytes] = []
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 30))  # one read, one copy, for any real file
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from exc


def map_input(path: StrPath) -> bytes | mmap.mmap:
    """An input file mapped read-only, with read_input's checks; read into memory instead
    where it cannot be mapped (an empty file; a file system that does not map files).

    Nothing is copied: a command that reads a few parts of a large file (`list` reads the
    notes, the symbol tables and 16 bytes at each probe of a 24 MB libjvm.so) pays only for
    the pages it touches; a fresh process spends ~11 ms reading libjvm.so into memory.
    The price, as for any mapped input (LLVM's tools map theirs too): the mapping holds a
    descriptor while it is alive, and a file truncated by another program while it is read
    ends the process with SIGBUS (README, "Inputs and outputs"). Commands that write an
    output read their input with read_input instead.
    """
    p = os.fspath(path)
    fd, size = _open_input(p)
    try:
        if size == 0:
            return b""
        try:
            return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from exc
            return _read_all(p, fd, size)  # e.g. ENODEV: this file system maps no file
    except ValueError as exc:  # mmap's own check: the file shrank since it was opened
        raise InputError(f"{p}: cannot read: the file changed while it was opened") from exc
    finally:
        os.close(fd)


def input_mode(path: StrPath) -> int:
    """The permission bits of an input (for its output)."""
    return stat.S_IMODE(_stat_input(os.fspath(path)).st_mode)


def umask_mode(base: int = 0o666) -> int:
    """The permission bits a newly created file gets from the process's umask (what
    open(..., "w") gives), for outputs such as reports that have no input to copy them from.

    Read from /proc/self/status (Linux 4.7+; no change to the process state); elsewhere the
    umask is read by setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return base & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return base & ~mask


def same_file(a: StrPath, b: StrPath) -> bool:
    """Whether two paths name one file (device and inode, through links), or resolve to one
    path when either does not exist."""
    try:
        return os.path.samestat(os.stat(a), os.stat(b))
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output(target: StrPath, inputs: Iterable[StrPath] = (), *,
                 in_place: bool = False, can_in_place: bool = True) -> None:
    """Raise OutputError unless `target` may be replaced by a new regular file.

    Refused: an existing target that is not a regular file (a directory, a device, a FIFO, a
    socket; followed through a symbolic link), and a target that is one of `inputs` (unless
    `in_place`; `can_in_place` says whether the message may suggest --in-place).
    """
    t = os.fspath(target)
    try:
        st: os.stat_result | None = os.stat(t)
    except (FileNotFoundError, NotADirectoryError):
        st = None  # a new file (or a dangling link, which the rename replaces)
    except OSError as exc:
        raise OutputError(f"{t}: cannot write: {exc.strerror or exc}") from exc
    folder = os.path.dirname(t) or "."
    if st is None and not os.path.isdir(folder):
        raise OutputError(f"{t}: cannot write: {folder} is not a folder")
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{t}: is a directory; name the output file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{t}: is {file_kind(st.st_mode)}, not a regular file; usdtpatch "
                          f"writes only regular files")
    if in_place:
        return
    for i in inputs:
        if same_file(t, i):
            how = "use --in-place to replace it" if can_in_place else "it is not overwritten"
            raise OutputError(f"{t}: is the input {i}; {how}")


def write_atomic(path: StrPath, data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` through a temporary file in the same folder and os.replace.

    Either the whole new content is at `path` afterwards or the old file is untouched (also
    on Ctrl-C: the temporary file is removed). `mode`, when given, is applied to the new file
    (e.g. the input's permission bits, or umask_mode() for a report); else the file keeps
    the temporary file's 0600. An existing `path` that is not a regular file is refused
    (check_output).
    """
    p = os.fspath(path)
    check_output(p, in_place=True)
    folder = os.path.dirname(p) or "."
    try:
        import tempfile  # only a command that writes pays for it

        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(f"{p}: cannot write: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, p)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(f"{p}: cannot write: {exc.strerror or exc}") from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
