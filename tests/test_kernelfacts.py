"""usdtpatch/kernelfacts.py: the uprobe syscall's answer is read one way by everything that
asks it (`rewrite --form auto`, kcheck, bench, the live tests' precondition)."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from pathlib import Path

import pytest

from usdtpatch.errors import UnsupportedError
from usdtpatch.kernelfacts import UPROBE_SYSCALL_ERRNO, Kernel, kernel_of_errno
from usdtpatch.live import kcheck, perf
from usdtpatch.rewriter.kernel import detect_kernel

X86_64_LINUX = sys.platform.startswith("linux") and platform.machine() == "x86_64"

# (the syscall's errno, the generation it means; None: a kernel that optimizes no uprobe)
ANSWERS = [(errno.ENXIO, Kernel.K618), (errno.EPROTO, Kernel.NOP10_SERIES),
           (errno.ENOSYS, None), (errno.EPERM, None)]


@pytest.mark.parametrize(("answer", "generation"), ANSWERS)
def test_each_answer_names_one_generation(answer: int, generation: Kernel | None) -> None:
    assert kernel_of_errno(answer)[0] is generation
    assert kernel_of_errno(None)[0] is None


def test_every_generation_reads_back_from_its_answer() -> None:
    assert {kernel_of_errno(e)[0] for e in UPROBE_SYSCALL_ERRNO.values()} == set(Kernel)
    assert len(set(UPROBE_SYSCALL_ERRNO.values())) == len(Kernel)


@pytest.mark.skipif(not X86_64_LINUX, reason="the uprobe syscall is x86-64 Linux's")
@pytest.mark.parametrize(("answer", "generation"), ANSWERS)
def test_kcheck_and_form_auto_read_the_answer_alike(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path, answer: int,
                                                    generation: Kernel | None) -> None:
    """The syscall really runs (336 from outside a trampoline fails on every kernel); only the
    errno it leaves is replaced. Before: has_uprobe_syscall accepted ENXIO alone, so kcheck
    refused a kernel of the nop10 series that `--form auto` knew."""
    monkeypatch.setattr(ctypes, "get_errno", lambda: answer)
    assert detect_kernel()[0] is generation
    assert perf.has_uprobe_syscall() is (generation is not None)
    pmu = tmp_path / "type"
    pmu.write_text("9\n")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(perf, "UPROBE_TYPE_PATH", str(pmu))
    if generation is None:
        with pytest.raises(UnsupportedError, match="no uprobe syscall"):
            kcheck.kernel_support()
    else:
        kcheck.kernel_support()  # no refusal
