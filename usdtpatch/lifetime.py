"""Worker processes that never outlive their parent (issue 20, item 4).

A forked worker (the emulator's detour verifiers, `rewrite -j`'s files) asks the kernel for
SIGKILL when its parent dies: prctl(PR_SET_PDEATHSIG) (Linux 2.1.57+). The request is made
in the worker, after the fork; a parent that died before it (the worker was reparented
already) is seen by getppid and the worker ends at once. PR_SET_PDEATHSIG follows the
thread that forked the worker: both pools fork from the main thread of their parent.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Make this process end (SIGKILL) when `parent`, the process that forked it, ends."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: the parent's exit is not watched
        return
    if os.getppid() != parent:  # the parent ended before the request was made
        os._exit(1)
