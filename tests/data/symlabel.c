/* symlabel.c: symbols that are no function symbol, inside a probe's window (issue 46,
 * class 2; tests/test_analysis_symlabels.py). Each probed function is
 * `xor %eax,%eax; <probe: nop>; LABEL: lea N(%rdi),%rax; ret`, and LABEL is a symbol of its
 * own: an exported NOTYPE entry, an exported OBJECT, a weak NOTYPE one, a local NOTYPE one
 * (in .symtab only: gdb's `break LABEL`). Built as a shared library (-DLIB: symlabel-main.c
 * calls the exported labels through the PLT, from another object) or as a program with its
 * own main. Every window of these probes holds LABEL strictly inside: before, the exported
 * ones were called into the middle of the new jump (SIGSEGV). `plain` has no label. */
#include <stdio.h>
#include <stdlib.h>
#include "custom_note.h"

#define LABELLED(NAME, LABEL, TYPE, BIND, N)                                   \
    ".globl " NAME "\n.type " NAME ", @function\n.p2align 4\n"                \
    NAME ":\n.cfi_startproc\n"                                                 \
    "\txor %eax, %eax\n"                                                       \
    "990: nop\n"                                                               \
    BIND " " LABEL "\n.type " LABEL ", " TYPE "\n"                            \
    LABEL ": lea " N "(%rdi), %rax\n"                                          \
    "\tret\n.cfi_endproc\n.size " NAME ", .-" NAME "\n"                        \
    CN_NOTE("990b", "0", "symlabel", NAME, "8@%rdi")

asm(".text\n"
    LABELLED("plain", ".Lplain_after", "@notype", ".local", "1")
    LABELLED("notype", "notype_entry", "@notype", ".globl", "3")
    LABELLED("object", "object_entry", "@object", ".globl", "5")
    LABELLED("weak", "weak_entry", "@notype", ".weak", "7")
    LABELLED("local", "local_entry", "@notype", ".local", "9")
    CN_BASE);

long plain(long), notype(long), notype_entry(long), object(long), object_entry(long);
long weak(long), weak_entry(long), local(long);

#ifndef LIB
int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (long k = 0; k < n; k++)
        printf("%ld %ld %ld %ld %ld %ld %ld %ld\n", plain(k), notype(k), notype_entry(k),
               object(k), object_entry(k), weak(k), weak_entry(k), local(k));
    return 0;
}
#endif
