"""Reading a DTrace provider file (.d), optionally through the C preprocessor."""

from __future__ import annotations

import os
import shlex
import subprocess

from usdtpatch.dtrace.parse import DScript, DScriptError, parse_dscript
from usdtpatch.errors import InputError
from usdtpatch.io import read_input


def preprocess(path: str, includes: list[str], defines: list[str]) -> str:
    """`$CPP` (default cpp) over `path` with -I and -D options; its output."""
    cpp = shlex.split(os.environ.get("CPP", "cpp"))
    cmd = [*cpp, *(f"-I{d}" for d in includes), *(f"-D{d}" for d in defines), path]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise InputError(f"{path}: cannot run {cpp[0]}: {exc.strerror or exc}") from exc
    if proc.returncode != 0:
        first = next((ln for ln in proc.stderr.splitlines() if ln.strip()), "no message")
        raise DScriptError(f"{path}: {cpp[0]} failed: {first}")
    return proc.stdout


def load_script(path: str, cpp: bool, includes: list[str], defines: list[str]) -> DScript:
    """Read (and with `cpp` preprocess) and parse one .d file."""
    if cpp:
        read_input(path)  # a missing file gets usdtpatch's message, not cpp's
        text = preprocess(path, includes, defines)
    else:
        text = read_input(path).decode("utf-8", "replace")
    return parse_dscript(text, path)
