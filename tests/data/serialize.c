/* serialize.c: a function holding an instruction capstone does not know (`serialize`,
 * 0f 01 e8; on a path never taken, since not every CPU has it) before a probe (issue 19,
 * item 6). Decoded by length (iced-x86), the function's analysis stays whole and the probe
 * gets a window. */
#include <stdio.h>
#include <stdlib.h>
#include "custom_note.h"

asm(".text\n.globl serfn\n.type serfn, @function\n.p2align 4\n"
    "serfn:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n"
    "\tcmp $-1000000, %rdi\n\tjne .Lser_go\n"
    "\t.byte 0x0f, 0x01, 0xe8\n"  /* serialize */
    ".Lser_go: add $1, %rax\n"
    "990: nop\n"
    "\tadd $2, %rax\n\tret\n"
    ".cfi_endproc\n.size serfn, .-serfn\n"
    CN_NOTE("990b", "0", "serialize", "site", "8@%rax")
    CN_BASE);

long serfn(long);

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 5;
    long s = 0;
    for (long i = 0; i < n; i++)
        s += serfn(i);
    printf("serialize: %ld\n", s);
    return 0;
}
