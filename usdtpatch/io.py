"""The one helper that touches files: read an input whole, write an output atomically."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from usdtpatch.errors import InputError, OutputError


def read_input(path: str | os.PathLike[str]) -> bytes:
    """Read a whole input file, or raise InputError with one clear sentence."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            return f.read()
    except IsADirectoryError as exc:
        raise InputError(f"{p}: is a directory, not an ELF file") from exc
    except FileNotFoundError as exc:
        raise InputError(f"{p}: no such file") from exc
    except PermissionError as exc:
        raise InputError(f"{p}: permission denied") from exc
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from exc


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` through a temporary file in the same folder and os.replace.

    Either the whole new content is at `path` afterwards or the old file is untouched.
    `mode`, when given, is applied to the new file (e.g. the input's permission bits).
    """
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
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
