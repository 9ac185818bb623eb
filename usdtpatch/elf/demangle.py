"""C++ name demangling through binutils' c++filt, one process for a whole batch of names.

(libstdc++'s __cxa_demangle through ctypes crashed the interpreter here, and no demangler is in
the dependency list, so the binutils tool that sits beside readelf does the work.) Names that
are not mangled, or all names when c++filt is missing, come back unchanged.
"""

from __future__ import annotations

import shutil
import subprocess


def demangle(names: list[str]) -> dict[str, str]:
    """Map each mangled name in `names` to its demangled form."""
    mangled = sorted({n for n in names if n.startswith("_Z")})
    if not mangled:
        return {}
    tool = shutil.which("c++filt")
    if tool is None:
        return {}
    try:
        done = subprocess.run([tool], input="\n".join(mangled) + "\n", capture_output=True,
                              text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return {}
    out = done.stdout.split("\n")
    return {m: d for m, d in zip(mangled, out, strict=False) if d}
