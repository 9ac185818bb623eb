"""What usdtpatch knows of the x86-64 Linux kernels it writes for, held once (docs/kernel.md):
the page, the uprobe syscall's number, and the one reading of that syscall's answer, which
tells the kernel generations apart.

Plain data and pure functions but one: `uprobe_syscall_errno` asks the running kernel.
Deferred imports: ctypes, platform and sys, inside it, so that a command that never asks does
not load them.
This module imports nothing of usdtpatch: every layer may import it, `elf/` and `x86/` too.
"""

from __future__ import annotations

import errno
from enum import Enum

PAGE = 4096  # the page: the kernel writes a site within one, the trampoline is one
UPROBE_SYSCALL = 336  # x86-64; another syscall on other architectures


class Kernel(Enum):
    """A kernel generation that optimizes uprobes (`--kernel` names one)."""

    K618 = "6.18"  # 6.18 .. 7.2: nop5 optimized
    NOP10_SERIES = "nop10-series"  # the queued series: only the 10-byte NOP optimized

    @property
    def label(self) -> str:
        """The generation in words, for a sentence: "Linux 6.18 to 7.2 optimize ..."."""
        return "Linux 6.18 to 7.2" if self is Kernel.K618 else "kernels of the nop10 series"

    @property
    def optimized_form(self) -> str:
        """The site form this generation optimizes (rewrite --form auto's choice for it)."""
        return "nop5" if self is Kernel.K618 else "combo10"


# The uprobe syscall called from outside a trampoline fails with this errno on each
# generation; a kernel without the syscall answers ENOSYS.
UPROBE_SYSCALL_ERRNO = {Kernel.K618: errno.ENXIO, Kernel.NOP10_SERIES: errno.EPROTO}


def uprobe_syscall_errno() -> int | None:
    """errno of the uprobe syscall called from here (outside any trampoline); None when this
    is not x86-64 Linux (336 is another syscall elsewhere) or the call returned 0."""
    import ctypes
    import platform
    import sys

    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(UPROBE_SYSCALL))
    return ctypes.get_errno() if rc == -1 else None


def kernel_of_errno(e: int | None) -> tuple[Kernel | None, str]:
    """The generation whose uprobe syscall answers `e` (None: a kernel that optimizes no
    uprobe, or an answer no known generation gives) and why, in words."""
    if e == UPROBE_SYSCALL_ERRNO[Kernel.K618]:
        return Kernel.K618, "the uprobe syscall answers ENXIO (Linux 6.18 to 7.2)"
    if e == UPROBE_SYSCALL_ERRNO[Kernel.NOP10_SERIES]:
        return Kernel.NOP10_SERIES, "the uprobe syscall answers EPROTO (the nop10 series)"
    if e is None:
        return None, "not an x86-64 Linux kernel with the uprobe syscall"
    if e == errno.ENOSYS:
        return None, "the kernel has no uprobe syscall (ENOSYS): it optimizes no uprobe"
    name = errno.errorcode.get(e, str(e))
    return None, f"the uprobe syscall answers {name}, which no known kernel generation does"
