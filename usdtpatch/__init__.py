"""usdtpatch: read, check and rewrite USDT probe sites for Linux optimized uprobes.

The library is `usdtpatch.api`, re-exported here: `load`, `check`, `rewrite`, `restore`,
`plan`, `verify`, `kcheck`, `dtrace_header`, `rewrite_plan` (the decisions of a rewrite),
`read_plan` (a plan document read back). The command line (`usdtpatch.cli`) is built on it.
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
    "CheckResult",
    "ElfFormatError",
    "ForkGuard",
    "Form",
    "Guard",
    "InputError",
    "OutputError",
    "RestoreOutcome",
    "RewriteOutcome",
    "UnsupportedError",
    "UsdtpatchError",
    "__version__",
    "check",
    "dtrace_header",
    "kcheck",
    "load",
    "plan",
    "read_plan",
    "restore",
    "rewrite",
    "rewrite_plan",
    "verify",
]

# The API's names are bound on first use: `usdtpatch list` imports only the modules it uses,
# not the whole API (its dataclasses, enums and the rewriter's modules). So they are written
# here again, without importing api: tests/test_api.py checks that they are api.__all__.
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
