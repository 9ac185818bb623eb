"""The one helper that touches files: read an input, check and write an output atomically.

What usdtpatch promises (README, "Inputs and outputs"): an input is only read, never
executed or changed (unless --in-place names it as the output); only regular files are read
(a FIFO, a device or a socket is refused before it is opened, and a file is read up to the
size it had when it was opened; `list` maps its files instead, see map_input); an output is
a new regular file put in place by one rename, so that either the whole new content is there
or the old file is untouched; an existing output that is not a regular file (a device such
as /dev/null, a FIFO, a socket, a directory) is refused, never written through; an output
that is an input (the same file, by any spelling or link) is refused unless --in-place.

write_atomic is the one writer (every output of every command goes through it but `bench
--chart`'s PNG, which matplotlib writes itself; what each guarantees and how it is tested:
docs/reliability.md, "Outputs"): safe for root in a folder
another user owns (descriptors only, issue 20), keeping the input's mode, owner, group and
attributes as `cp -p` does (Origin).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import signal
import stat
import threading  # signal handlers belong to the main thread
from collections.abc import Iterable
from dataclasses import dataclass

from usdtpatch.elf.image import named_extent
from usdtpatch.errors import InputError, OutputError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`list` does not)
if TYPE_CHECKING:
    from typing import Any

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


def _open_input(p: str, nofollow: bool = False) -> tuple[int, int]:
    """Open a regular input file without blocking (a FIFO swapped in after the first check
    cannot hang the open) and check its kind again: (descriptor, size). `nofollow` (the
    input of --in-place): a symbolic link, or a file with several names, swapped in since
    the output was checked, is refused too."""
    _refuse_kind(p, _stat_input(p).st_mode)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
                     | (os.O_NOFOLLOW if nofollow else 0))
    except IsADirectoryError as exc:
        raise InputError(f"{p}: is a directory, not an ELF file") from exc
    except FileNotFoundError as exc:
        raise InputError(f"{p}: no such file") from exc
    except PermissionError as exc:
        raise InputError(f"{p}: permission denied") from exc
    except OSError as exc:
        if nofollow and exc.errno == errno.ELOOP:
            raise OutputError(f"{p}: is a symbolic link; --in-place replaces only regular "
                              f"files: name the file it points to, or use -o") from exc
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        _refuse_kind(p, st.st_mode)
        if nofollow and st.st_nlink > 1:
            raise OutputError(f"{p}: has {st.st_nlink} hard links; --in-place would break "
                              f"them: use -o")
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
    total = left
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
    except MemoryError as exc:  # e.g. under a ulimit -v smaller than the file
        raise InputError(f"{p}: cannot read {total} bytes: out of memory") from exc


# A file larger than this is read only as far as its ELF structures name it
# (usdtpatch.elf.image.named_extent): a small ELF followed by a 12 GB hole is not read whole.
# Past that extent, a rewrite keeps up to this many bytes (copied as they are) and refuses
# more: the output is the whole file.
LARGE_FILE = 256 << 20


def _extent(p: str, fd: int, size: int, whole: bool) -> int:
    """How much of an ELF input of `size` bytes to read: all of it when it is not large;
    else what its structures name (`whole`: the file, unless more than LARGE_FILE bytes
    lie past that, which is refused with one line)."""
    if size <= LARGE_FILE:
        return size
    try:
        extent = named_extent(lambda offset, n: os.pread(fd, n, offset), size)
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    if whole and size - extent > LARGE_FILE:
        raise InputError(f"{p}: {size - extent} bytes lie past the end of everything its "
                         f"ELF headers name ({extent:#x}); an output keeps the whole file, "
                         f"and usdtpatch refuses more than {LARGE_FILE >> 20} MiB there")
    return size if whole else extent


def read_elf(path: StrPath) -> bytes:
    """An ELF input read for a command that only looks at it (read_input's checks): a file
    of more than LARGE_FILE bytes is read as far as its ELF structures name it."""
    p = os.fspath(path)
    fd, size = _open_input(p)
    try:
        return _read_all(p, fd, _extent(p, fd, size, whole=False))
    finally:
        os.close(fd)


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
        size = _extent(p, fd, size, whole=False)
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
    `in_place`; `can_in_place` says whether the message may suggest --in-place). With
    `in_place`, a target that is a symbolic link or has several hard links is refused
    (_refuse_links).
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
        if st is not None:
            _refuse_links(None, t, t)
        return
    for i in inputs:
        if same_file(t, i):
            how = "use --in-place to replace it" if can_in_place else "it is not overwritten"
            raise OutputError(f"{t}: is the input {i}; {how}")


# ------------------------------------------------------------------------------- writing

NAME_MAX = 255  # bytes in one file name (Linux, every common file system)
_SPECIAL = stat.S_ISUID | stat.S_ISGID

# Every output this process has put in place (by write_atomic), in order: after an
# interrupt the command line says which were written in full (cli.main, which empties it
# after each command; a library caller may clear it likewise).
WRITTEN: list[str] = []


@dataclass(frozen=True, slots=True)
class Origin:
    """What an output made from an input keeps of it, read from the input's descriptor:
    its permission bits (setuid, setgid and sticky included), owner, group and extended
    attributes (ACLs in system.posix_acl_*, file capabilities in security.capability, the
    user.* and other names; whatever the file system lists)."""

    mode: int
    uid: int
    gid: int
    xattrs: tuple[tuple[str, bytes], ...] = ()


def _origin(fd: int, st: os.stat_result) -> Origin:
    attrs: list[tuple[str, bytes]] = []
    try:
        names = os.listxattr(fd)
    except OSError:  # ENOTSUP: a file system without extended attributes
        names = []
    for name in names:
        with contextlib.suppress(OSError):  # removed meanwhile, or not ours to read
            attrs.append((name, os.getxattr(fd, name)))
    return Origin(stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, tuple(attrs))


def read_source(path: StrPath, in_place: bool = False) -> tuple[bytes, Origin]:
    """An ELF input's bytes and what its output keeps of it (Origin), both from one
    descriptor: the file whose bytes are read is the file whose mode, owner and attributes
    are kept. The whole file (a large one with much past its ELF structures is refused:
    _extent). `in_place`: the input is the output, and must not be a link (_open_input)."""
    p = os.fspath(path)
    fd, size = _open_input(p, nofollow=in_place)
    try:
        return _read_all(p, fd, _extent(p, fd, size, whole=True)), _origin(fd, os.fstat(fd))
    finally:
        os.close(fd)


def _refuse_links(dfd: int | None, name: str, p: str) -> None:
    """--in-place never breaks a link: a symbolic link or a file with several names is
    refused (binutils' strip writes through such a file, in place and not atomically; here
    the one rename would replace only the name given)."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"{p}: cannot write: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        to = os.readlink(name, dir_fd=dfd)
        raise OutputError(f"{p}: is a symbolic link (to {to}); --in-place replaces only "
                          f"regular files: name the file it points to, or use -o")
    if st.st_nlink > 1:
        raise OutputError(f"{p}: has {st.st_nlink} hard links; --in-place would break "
                          f"them: use -o")


def _temp_name(name: str) -> str:
    """A hidden, unpredictable name beside `name`, never longer than a name may be (a
    245-byte output name gets a short temporary name, not ENAMETOOLONG)."""
    token = os.urandom(8).hex()
    long = f".{name}.{token}.tmp"
    return long if len(os.fsencode(long)) <= NAME_MAX else f".{token}.tmp"


def _create(dfd: int) -> tuple[int, str | None]:
    """The new file's descriptor, and its temporary name (None: an O_TMPFILE file, with no
    name until it is linked; a process killed before then leaves nothing behind)."""
    flags = os.O_WRONLY | os.O_CLOEXEC
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile and os.path.isdir("/proc/self/fd"):  # linked through /proc (linkat(2))
        try:
            return os.open(".", flags | tmpfile, 0o600, dir_fd=dfd), None
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                raise  # EACCES, ENOSPC, EROFS: the O_EXCL way fails the same
    return _create_named(dfd, "")


def _create_named(dfd: int, name: str) -> tuple[int, str]:
    for _ in range(100):
        tmp = _temp_name(name or "usdtpatch")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
        return fd, tmp
    raise OSError(errno.EEXIST, "no unused temporary name")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view[:1 << 30])
        view = view[n:]


def _finish(fd: int, mode: int, origin: Origin | None) -> None:
    """Owner, group, mode and attributes, set on the descriptor (as `cp -p`/`install` do):
    the owner and group of `origin` where this process may give them (root: always); when
    either is not kept, the setuid and setgid bits are dropped (never bits the new owner
    did not have). fchown comes first (it clears setuid bits and file capabilities), then
    fchmod, then the extended attributes (an ACL sets the group bits to its mask, as on the
    input)."""
    if origin is not None:
        try:
            os.fchown(fd, origin.uid, origin.gid)
        except PermissionError:
            with contextlib.suppress(PermissionError):
                os.fchown(fd, -1, origin.gid)  # a group this user is in
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (origin.uid, origin.gid):
            mode &= ~_SPECIAL
    os.fchmod(fd, mode)
    if origin is not None:
        for name, value in origin.xattrs:
            # what this process may not set (a capability without CAP_SETFCAP, a file
            # system without xattrs) is dropped, as `cp -a` does
            with contextlib.suppress(PermissionError, OSError):
                os.setxattr(fd, name, value)


class _Deferred:
    """SIGINT, SIGTERM and SIGHUP held back while an output is renamed into place and
    recorded as written: the interrupt then comes after, and says that it was written."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.caught: list[int] = []
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _Deferred:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._hold)
        return self

    def _hold(self, signum: int, _frame: object) -> None:
        self.caught.append(signum)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(self.caught):
            signal.raise_signal(sig)  # the handler it would have met (e.g. KeyboardInterrupt)


def signals_held() -> _Deferred:
    """SIGINT, SIGTERM and SIGHUP held back for a `with` block and raised after it: a
    second interrupt while a command stops its work after the first comes after the record
    of what was written (api.rewrite_files' workers)."""
    return _Deferred()


def write_atomic(path: StrPath, data: bytes, mode: int | None = None, *,
                 origin: Origin | None = None, in_place: bool = False) -> None:
    """Write `data` to `path` as a new file put in place by one rename.

    Either the whole new content is at `path` afterwards or the old file is untouched (on an
    error, Ctrl-C, SIGTERM or SIGHUP; killed, the O_TMPFILE file leaves nothing). Made safe
    for root in a folder another user owns: the folder is opened once and everything after
    is relative to that descriptor; the new file has no name (O_TMPFILE) or an unpredictable
    one created with O_EXCL; its mode, owner and attributes are set and it is synced through
    its descriptor, never through a name; it is linked beside `path` (in a folder where
    another user may rename names: inside a private 0700 folder made there, _Private) and
    renamed, and what the rename put in place is checked to be that file. `mode`: the
    permission bits (default: what the umask gives a new file, as open() and systemtap's
    dtrace make it); `origin`:
    an input's mode, owner, group and attributes, kept as `cp -p` keeps them (_finish).
    `in_place`: `path` is the input, and a symbolic link or a file with several hard links
    is refused (_refuse_links). An existing `path` that is not a regular file is refused
    (check_output).
    """
    p = os.fspath(path)
    check_output(p, in_place=in_place)
    folder, name = os.path.split(p)
    try:
        dfd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise OutputError(f"{p}: cannot write: {exc.strerror or exc}") from exc
    try:
        if in_place:
            _refuse_links(dfd, name, p)
        bits = origin.mode if mode is None and origin is not None else \
            umask_mode() if mode is None else mode
        _write_in(dfd, p, name, data, bits, origin)
    finally:
        os.close(dfd)


def _others_may_rename(dfd: int) -> bool:
    """Whether another user may rename or remove names in the folder: it is not this
    process's, or others may write to it without the sticky bit (in /tmp, 1777, a name is
    its owner's)."""
    st = os.fstat(dfd)
    return st.st_uid != os.geteuid() or \
        (bool(st.st_mode & 0o022) and not st.st_mode & stat.S_ISVTX)


class _Private:
    """A folder of this process's, 0700, made inside the output's folder (same file
    system): a name in it cannot be swapped by anyone else, even where the output's folder
    is theirs. The new file gets its temporary name there and is renamed out of it."""

    def __init__(self, dfd: int) -> None:
        self.parent = dfd
        self.name = ""
        for _ in range(100):
            name = f".usdtpatch-{os.urandom(8).hex()}"
            try:
                os.mkdir(name, 0o700, dir_fd=dfd)
            except FileExistsError:
                continue
            self.name = name
            break
        else:
            raise OSError(errno.EEXIST, "no unused temporary name")
        try:
            self.fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=dfd)
        except OSError:
            self.close()
            raise
        st = os.fstat(self.fd)  # the folder opened is one only this user may change
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            self.close()
            raise OSError(errno.EPERM, "the temporary folder was replaced by another user's")

    def close(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(OSError):  # moved away by the folder's owner: theirs now
            os.rmdir(self.name, dir_fd=self.parent)


def _link(fd: int, where: int, name: str) -> str:
    """Give the O_TMPFILE file `fd` (its content and metadata final) a temporary name in
    folder `where`."""
    for _ in range(100):
        candidate = _temp_name(name)
        try:
            os.link(f"/proc/self/fd/{fd}", candidate, dst_dir_fd=where)
        except FileExistsError:
            continue
        return candidate
    raise OSError(errno.EEXIST, "no unused temporary name")


def _write_in(dfd: int, p: str, name: str, data: bytes, mode: int,
              origin: Origin | None) -> None:
    tmp: str | None = None  # the new file's name in `where` (None: it has none)
    where = dfd
    private: _Private | None = None
    fd = -1
    try:
        guarded = _others_may_rename(dfd)
        fd, tmp = _create(dfd)
        if tmp is not None and guarded:  # no O_TMPFILE here: named in a private folder
            os.unlink(tmp, dir_fd=dfd)
            os.close(fd)
            tmp, fd = None, -1
            private = _Private(dfd)
            where = private.fd
            fd, tmp = _create_named(where, name)
        _write_all(fd, data)
        _finish(fd, mode, origin)
        os.fsync(fd)
        if tmp is None:  # name the O_TMPFILE file: where no other user can swap the name
            if guarded:
                private = _Private(dfd)
                where = private.fd
            tmp = _link(fd, where, name)
        ours = os.fstat(fd)
        with _Deferred():
            os.rename(tmp, name, src_dir_fd=where, dst_dir_fd=dfd)
            tmp = None
            there = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if (there.st_dev, there.st_ino) != (ours.st_dev, ours.st_ino):
                raise OutputError(f"{p}: cannot write: the temporary file was replaced by "
                                  f"another program before it was renamed; {p} is not ours")
            WRITTEN.append(p)
        with contextlib.suppress(OSError):
            os.fsync(dfd)  # the rename itself on disk
    except OSError as exc:
        raise OutputError(f"{p}: cannot write: {exc.strerror or exc}") from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=where)
        if fd >= 0:
            os.close(fd)
        if private is not None:
            private.close()
