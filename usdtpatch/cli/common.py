"""What several subcommands share: exit codes, error lines, demangled names."""

from __future__ import annotations

from typing import IO

from usdtpatch.elf.demangle import demangle
from usdtpatch.elf.image import parse_elf
from usdtpatch.errors import UsdtpatchError
from usdtpatch.io import StrPath, read_input
from usdtpatch.sites.probes import ProbeSet, read_probes

__all__ = [
    "EXIT_FAIL",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNUSABLE",
    "error_line",
    "function_names",
    "load",
    "printable",
]

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_UNUSABLE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def load(path: StrPath) -> ProbeSet:
    """`usdtpatch.api.load` (the same steps), without importing the whole API: `list` imports
    only the modules it uses."""
    return read_probes(parse_elf(read_input(path)))


# control characters (C0, DEL, C1) and the other characters str.splitlines breaks at
_UNPRINTABLE = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_UNPRINTABLE.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def printable(text: str) -> str:
    """`text` with every character that would break the line or drive the terminal (a file's
    note strings can hold any byte) written as an escape: one line, shown as is."""
    return text.translate(_UNPRINTABLE)


def error_line(path: str, exc: UsdtpatchError, err: IO[str]) -> None:
    """One line on stderr naming the file once."""
    text = str(exc)
    line = f"usdtpatch: {text}" if text.startswith(path) else f"usdtpatch: {path}: {text}"
    print(printable(line), file=err)


def function_names(sets: list[ProbeSet]) -> dict[str, str]:
    """Demangled names of every function that holds a probe, in one batch."""
    return demangle([p.function for ps in sets for p in ps.probes if p.function])
