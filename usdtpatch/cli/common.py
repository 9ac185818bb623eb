"""What several subcommands share: exit codes, loading an input, error lines."""

from __future__ import annotations

from typing import IO

from usdtpatch.elf.demangle import demangle
from usdtpatch.elf.image import parse_elf
from usdtpatch.errors import UsdtpatchError
from usdtpatch.io import read_input
from usdtpatch.sites.probes import ProbeSet, read_probes

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_UNUSABLE = 2
EXIT_INTERNAL = 3


def load(path: str) -> ProbeSet:
    """Read and parse one input file into its probes (raises UsdtpatchError)."""
    return read_probes(parse_elf(read_input(path)))


def error_line(path: str, exc: UsdtpatchError, err: IO[str]) -> None:
    """One line on stderr naming the file once."""
    text = str(exc)
    print(f"usdtpatch: {text}" if text.startswith(path) else f"usdtpatch: {path}: {text}",
          file=err)


def function_names(sets: list[ProbeSet]) -> dict[str, str]:
    """Demangled names of every function that holds a probe, in one batch."""
    return demangle([p.function for ps in sets for p in ps.probes if p.function])
