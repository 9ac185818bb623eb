"""`rewrite --form auto`: the site form the kernel that will run the binary optimizes.

The kernel generations are rows of usdtpatch.kernelfacts.GENERATIONS (docs/kernel.md): each
optimizing one names the form a rewrite for it writes (its `auto_form`: nop5, with the
red-zone guard where the site needs it, for the nop5 generation; combo10 for the nop10 one). A
kernel of the generation that optimizes nothing keeps every site on the int3 path whatever its
form, so `auto` leaves the file as it is there (a named form still rewrites it).

The generation is told by the uprobe syscall (336), called from outside a trampoline (each
row's errno), never by the release. `--kernel NAME` names the generation instead, for a binary
built to run on another machine. The detector is a parameter so that tests can fake its
answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from usdtpatch.analysis.forms import Form, form_for
from usdtpatch.kernelfacts import Generation, generation, kernel_of_errno, uprobe_syscall_errno

AUTO = "auto"


@dataclass(frozen=True, slots=True)
class FormChoice:
    """The form a rewrite uses (None: none, the file stays as it is) and why."""

    form: Form | None
    kernel: Generation | None  # the generation it is for (None: one that optimizes nothing)
    why: str
    detected: bool  # from the running kernel (not named by --form or --kernel)


def detect_kernel(errno_of: Callable[[], int | None] | None = None
                  ) -> tuple[Generation | None, str]:
    """The running kernel's optimizing generation (None: it optimizes no uprobe) and how it
    was told. `errno_of` (default `uprobe_syscall_errno`, looked up when called) answers for
    the kernel."""
    return kernel_of_errno((errno_of or uprobe_syscall_errno)())


def choose_form(form: Form | str, kernel: Generation | str | None = None,
                errno_of: Callable[[], int | None] | None = None) -> FormChoice:
    """The form for `form` (a Form, its value, or "auto") and `kernel` (a generation named for
    another machine, or None: the running kernel's, when the form is auto)."""
    k = None if kernel is None else kernel if isinstance(kernel, Generation) \
        else generation(kernel)
    if k is not None and not k.optimizes:
        raise ValueError(f"the {k.name} generation optimizes no uprobe: name one that does "
                         f"(--kernel) or a form")
    if form != AUTO:
        f = form if isinstance(form, Form) else Form(form)
        return FormChoice(f, k, f"--form {f.value}", False)
    if k is not None:
        f = form_for(k)
        return FormChoice(f, k, f"--form auto with --kernel {k.name}: {_fast(k)}", False)
    gen, how = detect_kernel(errno_of)
    if gen is None:
        return FormChoice(None, None, f"--form auto: {how}; the sites are kept as they are "
                                      f"(name a form, or --kernel, to rewrite for another "
                                      f"kernel)", True)
    return FormChoice(form_for(gen), gen, f"--form auto: this kernel: {how}; {_fast(gen)}",
                      True)


def _fast(k: Generation) -> str:
    f = form_for(k)
    guard = ", red-zone guard where needed" if k.red_zone_hazard else ""
    if f.optimized_offset:
        return (f"it optimizes only the {k.nop_length}-byte NOP (form {f.value}{guard}: "
                f"a 1-byte nop, then the NOP at pc + 1)")
    return f"it optimizes {k.nop_length}-byte NOPs (form {f.value}{guard})"
