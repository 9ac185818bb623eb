"""A synthetic ELF with N USDT probes, one per small function, written as assembly and built
with binutils (`as`, `ld`): 1,000,000 probes build in a minute, where the C generator
(fixtures/gen_synthetic.py) needs a compiler run per probe's macro.

Function k (`f<k>`, 8 bytes, 16-aligned, with an FDE from `.cfi_*`):
    push %rbp; mov %rsp,%rbp; nop (the probe syn:p<k>, argument 8@%rdi); pop %rbp; ret
Its site is a 1-byte nop whose window is [push, nop] (backward: the function ends 2 bytes
after the probe), as at -O0 -fno-omit-frame-pointer. The probe's label is local (`.L`), as
sys/sdt.h's are: a symbol there would be a way in (issue 46), and no backward window would
do. `shared_pc=True` instead gives N notes that all name the one nop of f0 (the
notes-sharing-one-pc case).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

_NOTE = (".pushsection .note.stapsdt,\"?\",\"note\"\n.balign 4\n"
         ".4byte 2f-1f, 4f-3f, 3\n1: .asciz \"stapsdt\"\n2: .balign 4\n"
         "3: .8byte {pc}\n.8byte _.stapsdt.base\n.8byte 0\n"
         ".asciz \"syn\"\n.asciz \"p{k}\"\n.asciz \"8@%rdi\"\n4: .balign 4\n.popsection\n")


def write_asm(path: Path, n: int, shared_pc: bool = False) -> None:
    with path.open("w") as out:
        out.write(".section .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"
                  ".weak _.stapsdt.base\n.hidden _.stapsdt.base\n"
                  "_.stapsdt.base: .space 1\n.size _.stapsdt.base, 1\n.text\n")
        functions = 1 if shared_pc else n
        for k in range(functions):
            out.write(f".globl f{k}\n.type f{k}, @function\n.balign 16\nf{k}:\n.cfi_startproc\n"
                      "push %rbp\n.cfi_def_cfa_offset 16\nmov %rsp, %rbp\n"
                      f".Lp{k}: nop\npop %rbp\n.cfi_def_cfa_offset 8\nret\n.cfi_endproc\n"
                      f".size f{k}, .-f{k}\n")
            if not shared_pc:
                out.write(_NOTE.format(pc=f".Lp{k}", k=k))
        if shared_pc:
            for k in range(n):
                out.write(_NOTE.format(pc=".Lp0", k=k))


def build(directory: Path, n: int, shared_pc: bool = False) -> Path:
    """The shared library with n probes (built once per name in `directory`)."""
    name = f"scale-{n}{'-onepc' if shared_pc else ''}.so"
    out = directory / name
    if out.exists():
        return out
    src = directory / f"{name}.s"
    write_asm(src, n, shared_pc)
    obj = directory / f"{name}.o"
    subprocess.run(["as", "-o", str(obj), str(src)], check=True)
    tmp = directory / f"{name}.tmp"
    subprocess.run(["ld", "-shared", "--eh-frame-hdr", "-o", str(tmp), str(obj)], check=True)
    tmp.rename(out)
    src.unlink()
    obj.unlink()
    return out
