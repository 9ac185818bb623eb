"""A setuptools `build_ext` that rewrites (or checks) every extension module it builds.

    # pyproject.toml
    [build-system]
    requires = ["setuptools>=61", "usdtpatch"]
    build-backend = "setuptools.build_meta"

    [tool.usdtpatch]
    form = "nop5"           # nop5 | combo5 | combo10
    redzone_guard = "auto"  # auto | always | never (rewrite's --redzone-guard)
    fork_guard = "auto"     # auto | always | never (rewrite's --fork-guard)
    fail_on = "warning"     # info | warning | error | never
    mode = "rewrite"        # rewrite | check

    # setup.py
    from setuptools import Extension, setup
    from usdtpatch.integrate.setuptools import build_ext
    setup(ext_modules=[Extension("pkg._probes", ["src/probes.c"])],
          cmdclass={"build_ext": build_ext})

Each module is handled right after it is linked, through the Python API (no subprocess):
rewritten in place, checked, its report written to `<build_temp>/usdtpatch/<module>.json`
(and `.html`), every finding printed on one line, and the build stopped with the finding that
reaches `fail_on`. build_ext's own up-to-date test still applies: a module it skips keeps its
rewritten bytes, and a module carrying usdtpatch's marker is left as it is, so a second build
changes nothing.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from setuptools.command.build_ext import build_ext as _build_ext
from setuptools.errors import ExecError, SetupError

from usdtpatch.api import UsdtpatchError
from usdtpatch.integrate.step import StepOptions, run_step

# [tool.usdtpatch] key -> StepOptions field (both spellings of the two-word keys), the names of
# the command line's options (--redzone-guard, --fork-guard, --fail-on).
_KEYS = {"form": "form", "redzone-guard": "redzone_guard",
         "redzone_guard": "redzone_guard", "fail-on": "fail_on", "fail_on": "fail_on",
         "fork-guard": "fork_guard", "fork_guard": "fork_guard", "mode": "mode",
         "verify": "verify"}


def read_options(pyproject: Path) -> StepOptions:
    """The step options of `[tool.usdtpatch]` in `pyproject` (defaults when absent).

    Raises ValueError naming the file and the key when a key or a value is wrong.
    """
    if not pyproject.is_file():
        return StepOptions()
    try:
        with pyproject.open("rb") as f:
            table = tomllib.load(f).get("tool", {}).get("usdtpatch", {})
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{pyproject}: not valid TOML: {exc}") from exc
    if not isinstance(table, dict):
        raise ValueError(f"{pyproject}: [tool.usdtpatch] must be a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        field = _KEYS.get(key)
        if field is None:
            hint = " (the red-zone guard's key is redzone_guard)" if key == "guard" else ""
            raise ValueError(f"{pyproject}: [tool.usdtpatch] has no key {key!r}{hint} (known: "
                             f"form, redzone_guard, fork_guard, fail_on, mode, verify)")
        if not isinstance(value, bool if field == "verify" else str):
            raise ValueError(f"{pyproject}: [tool.usdtpatch] {key} has the wrong type: "
                             f"{value!r}")
        values[field] = value
    try:
        return StepOptions(**values)
    except ValueError as exc:
        raise ValueError(f"{pyproject}: [tool.usdtpatch] {exc}") from exc


class build_ext(_build_ext):  # type: ignore[misc,unused-ignore]  # setuptools names it so
    """setuptools' build_ext, plus the usdtpatch step on every extension module it links."""

    def _usdtpatch_options(self) -> StepOptions:
        root = Path(getattr(self.distribution, "src_root", None) or os.curdir)
        try:
            return read_options(root / "pyproject.toml")
        except ValueError as exc:
            raise SetupError(f"usdtpatch: {exc}") from exc

    def build_extension(self, ext: Any) -> None:
        super().build_extension(ext)
        path = self.get_ext_fullpath(ext.name)
        if not os.path.exists(path):  # nothing was linked (e.g. a dry run)
            return
        opts = self._usdtpatch_options()
        report = Path(self.build_temp) / "usdtpatch" / f"{self.get_ext_fullname(ext.name)}.json"
        try:
            res = run_step(path, None, opts, report, log=sys.stderr)
        except UsdtpatchError as exc:
            raise ExecError(f"usdtpatch: {path}: {exc.detail(path)}") from exc
        if res.failed:
            worst = next((line for line in res.lines if "[" in line), res.lines[-1])
            raise ExecError(f"usdtpatch stopped the build of {ext.name}: {worst}")
