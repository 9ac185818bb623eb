"""Build-step integration: the post-link step and the files build systems load.

This package is also the `cmake.root` entry point (scikit-build-core sets `usdtpatch_ROOT` to
this folder, so `find_package(usdtpatch CONFIG)` finds `cmake/usdtpatchConfig.cmake` with no
flag). Its folders are package data:

- `cmake/`: the CMake config package (`usdtpatch --cmake-dir` prints it),
- `make/usdtpatch.mk`: the GNU make include file (`usdtpatch --make-include`),
- `include/`: usdtpatch's own `sys/sdt.h` (`usdtpatch --include-dir`),
- `debhelper/`: `dh_usdtpatch` and the dh sequence addon `Debian/Debhelper/Sequence/usdtpatch.pm`
  (`usdtpatch --debhelper-dir`: the folder for PATH and PERL5LIB),
- `rpm/macros.usdtpatch`: the RPM macros (`usdtpatch --rpm-macros` prints them).

The step itself (rewrite or check one linked file, write the report, fail on findings) is
`usdtpatch.integrate.step`; the setuptools command is `usdtpatch.integrate.setuptools.build_ext`.
Nothing here imports the rewriter until a step runs: `--cmake-dir` stays instant.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def cmake_dir() -> Path:
    """The folder holding usdtpatchConfig.cmake (for CMAKE_PREFIX_PATH or usdtpatch_DIR)."""
    return HERE / "cmake"


def make_include() -> Path:
    """The GNU make include file that defines `usdtpatch_rewrite` and `usdtpatch_check`."""
    return HERE / "make" / "usdtpatch.mk"


def include_dir() -> Path:
    """The folder to put first on the include path for usdtpatch's own `sys/sdt.h`.

    In a wheel it is package data (usdtpatch/integrate/include); in a source checkout the same
    path is a link to the repository's top-level sdt_headers/.
    """
    return HERE / "include"


def debhelper_dir() -> Path:
    """The folder holding `dh_usdtpatch` (put it on PATH) and `Debian/Debhelper/Sequence/
    usdtpatch.pm` (put it on PERL5LIB), for `dh $@ --with usdtpatch`."""
    return HERE / "debhelper"


def rpm_macros() -> Path:
    """The RPM macros file (`rpmbuild --load FILE`, or a copy in /usr/lib/rpm/macros.d/)."""
    return HERE / "rpm" / "macros.usdtpatch"


__all__ = ["cmake_dir", "debhelper_dir", "include_dir", "make_include", "rpm_macros"]
