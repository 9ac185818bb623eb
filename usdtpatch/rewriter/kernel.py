"""`rewrite --form auto`: the site form the kernel that will run the binary optimizes.

Two generations of x86-64 kernels optimize uprobes (docs/kernel.md):

- Linux 6.18 to 7.2 optimize a uprobe on a 5-byte NOP into a call to a trampoline: form
  `nop5`, with the red-zone guard where the site needs it (`--redzone-guard auto`).
- The queued upstream "nop10" series (not in a release yet) optimizes only the 10-byte NOP
  `66 2e 0f 1f 84 00 00 00 00 00` (red-zone safe) and no longer the nop5: form `combo10`.
- A kernel without the uprobe syscall optimizes no uprobe: every site stays on the int3 path
  whatever its form, so `auto` leaves the file as it is (a named form still rewrites it).

The generation is told by the uprobe syscall (336), called from outside a trampoline: ENOSYS
means no uprobe syscall, ENXIO 6.18..7.2, EPROTO the nop10 series (the test libbpf's kernel
tree uses). `--kernel 6.18|nop10-series` names the generation instead, for a binary built to
run on another machine. The detector is a parameter so that tests can fake its answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from usdtpatch.analysis.forms import Form
from usdtpatch.kernelfacts import Kernel, kernel_of_errno, uprobe_syscall_errno

AUTO = "auto"
FORM_OF = {Kernel.K618: Form.NOP5, Kernel.NOP10_SERIES: Form.COMBO10}


@dataclass(frozen=True, slots=True)
class FormChoice:
    """The form a rewrite uses (None: none, the file stays as it is) and why."""

    form: Form | None
    kernel: Kernel | None  # the generation it is for (None: one that optimizes nothing)
    why: str
    detected: bool  # from the running kernel (not named by --form or --kernel)


def detect_kernel(errno_of: Callable[[], int | None] | None = None
                  ) -> tuple[Kernel | None, str]:
    """The running kernel's generation (None: it optimizes no uprobe) and how it was told.
    `errno_of` (default `uprobe_syscall_errno`, looked up when called) answers for the
    kernel."""
    return kernel_of_errno((errno_of or uprobe_syscall_errno)())


def choose_form(form: Form | str, kernel: Kernel | str | None = None,
                errno_of: Callable[[], int | None] | None = None) -> FormChoice:
    """The form for `form` (a Form, its value, or "auto") and `kernel` (a generation named for
    another machine, or None: the running kernel's, when the form is auto)."""
    k = None if kernel is None else kernel if isinstance(kernel, Kernel) else _kernel(kernel)
    if form != AUTO:
        f = form if isinstance(form, Form) else Form(form)
        return FormChoice(f, k, f"--form {f.value}", False)
    if k is not None:
        f = FORM_OF[k]
        return FormChoice(f, k, f"form {f.value}, {_fast(k)} (--form auto, --kernel {k.value})",
                          False)
    gen, how = detect_kernel(errno_of)
    if gen is None:
        return FormChoice(None, None, f"--form auto: {how}; the sites are kept as they are "
                                      f"(name a form, or --kernel, to rewrite for another "
                                      f"kernel)", True)
    return FormChoice(FORM_OF[gen], gen, f"form {FORM_OF[gen].value}, {_fast(gen)} "
                                         f"(--form auto, this kernel: {how})", True)


def _kernel(value: str) -> Kernel:
    try:
        return Kernel(value)
    except ValueError:
        raise ValueError(f"kernel must be one of {', '.join(k.value for k in Kernel)}, "
                         f"not {value!r}") from None


def _fast(k: Kernel) -> str:
    """What the form is for: the sentence after "form F, "."""
    if k is Kernel.K618:
        return (f"the one {k.label} optimize (5-byte NOPs; the red-zone guard where "
                f"needed)")
    return f"the one {k.label} optimize (only the 10-byte NOP)"
