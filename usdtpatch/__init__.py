"""usdtpatch: read, check and rewrite USDT probe sites for Linux optimized uprobes.

The library is `usdtpatch.api`, re-exported here: `load`, `check`, `rewrite`, `restore`,
`plan`, `verify`, `kcheck`, `dtrace_header`, `rewrite_plan` (the decisions of a rewrite),
`read_plan` (a plan document read back), and what the command line (`usdtpatch.cli`) and the
build integration (`usdtpatch.integrate`), which are built on it and use nothing else of the
library, need besides: `check_bytes` and `rewrite_bytes` (bytes in and out), `check_keeping`
(each site handed over as it is decided), `rewrite_files` (many files, in `jobs` processes),
`copy`, `marked` (rewritten before), `read_protocol` (for
`plan(protocol=...)`), `dtrace_semaphores`, `bench`, the checked output writes `check_output`,
`write_atomic` and `umask_mode`, and `no_match`, `demangle` and `demangle_unavailable`.
"""

from __future__ import annotations

from importlib import import_module as _import_module

from usdtpatch.errors import (
    ElfFormatError,
    InputError,
    OutputError,
    UnsupportedError,
    UsdtpatchError,
)
from usdtpatch.version import __version__

_TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if _TYPE_CHECKING:  # the names of api.__all__, for type checkers
    from usdtpatch.api import *  # noqa: F403

# ruff: noqa: F405 (the API's names below are those of the star import above)
__all__ = [
    "CALL_CHOICES",
    "CODES",
    "DEFAULT_KERNEL",
    "GENERATIONS",
    "KERNEL_CHOICES",
    "NOT_FOUND",
    "PAGE",
    "RENAMED",
    "SYSTEM_JDK",
    "TASK_SIZE",
    "WRITTEN",
    "BenchReport",
    "CheckReport",
    "CheckResult",
    "ElfFormatError",
    "FileRewrite",
    "ForkGuard",
    "Form",
    "Generation",
    "Guard",
    "InputError",
    "KcheckReport",
    "OutputError",
    "Plan",
    "Probe",
    "ProbeSet",
    "Protocol",
    "ProtocolError",
    "RestoreOutcome",
    "RewriteOutcome",
    "RewritePlan",
    "Rewritten",
    "SiteDecision",
    "StrPath",
    "UnsupportedError",
    "UsdtpatchError",
    "VerifyReport",
    "__version__",
    "bench",
    "check",
    "check_bytes",
    "check_keeping",
    "check_output",
    "copy",
    "demangle",
    "demangle_unavailable",
    "dtrace_header",
    "dtrace_semaphores",
    "kcheck",
    "load",
    "marked",
    "no_match",
    "plan",
    "read_plan",
    "read_protocol",
    "restore",
    "rewrite",
    "rewrite_bytes",
    "rewrite_files",
    "rewrite_plan",
    "umask_mode",
    "verify",
    "write_atomic",
]

# The API's names are bound on first use: `import usdtpatch` (which every submodule's import
# runs) does not import api and what it loads. So they are written here again, without
# importing api: tests/test_api.py checks that they are api.__all__.
_API_NAMES = frozenset(__all__) - {"ElfFormatError", "InputError", "OutputError",
                                   "UnsupportedError", "UsdtpatchError", "__version__"}


def __getattr__(name: str) -> object:
    """Bind the API's names on first use (PEP 562)."""
    if name in _API_NAMES:
        value = getattr(_import_module("usdtpatch.api"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'usdtpatch' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API (`dir(usdtpatch)`, completion): load, check, rewrite, ... whether or not
    they are bound yet, without the module's helpers."""
    return sorted(__all__)
