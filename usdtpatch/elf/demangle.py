"""C++ name demangling through binutils' c++filt, one process for a batch of names.

(libstdc++'s __cxa_demangle through ctypes crashed the interpreter here, and no demangler is in
the dependency list, so the binutils tool that sits beside readelf does the work.) Names that
are not mangled, or all names when c++filt is missing, come back unchanged.

The names go to c++filt as arguments (after `--`), and its output comes back through a pipe of
a process started with os.posix_spawn: nothing is written to its standard input, so the pipe
cannot fill up in both directions, and `list` does not pay for importing subprocess.
"""

from __future__ import annotations

import os

MAX_ARGS_BYTES = 64 * 1024  # per c++filt process, far below any ARG_MAX


def _which(tool: str) -> str | None:
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", tool)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _run(tool: str, names: list[str]) -> list[str] | None:
    """c++filt's output lines for `names`, or None when it cannot be run."""
    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:
        try:
            pid = os.posix_spawn(tool, [tool, "--", *names], dict(os.environ), file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, w, 1),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_CLOSE, r),
                (os.POSIX_SPAWN_CLOSE, w),
            ])
        except OSError:
            return None
        os.close(w)
        w = -1
        chunks: list[bytes] = []
        while True:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        _pid, status = os.waitpid(pid, 0)
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        return b"".join(chunks).decode("utf-8", "replace").split("\n")
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


NOT_FOUND = ("c++filt (binutils) is not on PATH: C++ function names are shown mangled "
             "(install binutils to demangle them)")


def unavailable(names: list[str]) -> bool:
    """Whether some of `names` is mangled and c++filt is not there to demangle it (the
    commands say so in one line: demangling is not a Python dependency, binutils is)."""
    return any(n.startswith("_Z") for n in names) and _which("c++filt") is None


def demangle(names: list[str]) -> dict[str, str]:
    """Map each mangled name in `names` to its demangled form."""
    mangled = sorted({n for n in names if n.startswith("_Z") and "\n" not in n
                      and "\0" not in n})
    if not mangled:
        return {}
    tool = _which("c++filt")
    if tool is None:
        return {}
    out: dict[str, str] = {}
    start = 0
    while start < len(mangled):
        size = 0
        end = start
        while end < len(mangled) and (end == start or size + len(mangled[end]) < MAX_ARGS_BYTES):
            size += len(mangled[end]) + 1
            end += 1
        batch = mangled[start:end]
        lines = _run(tool, batch)
        if lines is None:
            return out
        out.update((m, d) for m, d in zip(batch, lines, strict=False) if d)
        start = end
    return out
