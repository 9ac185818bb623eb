/* relr.c: a pointer to the instruction after a probe, in a table the loader fills through a
   packed relative relocation (DT_RELR: the value is the word at the place, plus the base).
   Build: gcc -O2 -fPIE -pie -Wl,-z,pack-relative-relocs -I fixtures/src relr.c -o relr */
#include <stdio.h>
#include <stdlib.h>
#include "custom_note.h"

asm(CN_BASE ".text\n"
    /* after: the instruction after the probe is entered through relr_table[0] */
    ".globl relr_fn\n.type relr_fn, @function\n.p2align 4\n"
    "relr_fn:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n"
    "990: nop\n"
    ".Lrelr_after: lea 3(%rdi), %rax\n"
    "\tret\n.cfi_endproc\n.size relr_fn, .-relr_fn\n"
    CN_NOTE("990b", "0", "relr", "after", "8@%rdi")
    /* plain: no way in from elsewhere (rewritten) */
    ".globl plain_fn\n.type plain_fn, @function\n.p2align 4\n"
    "plain_fn:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n"
    "990: nop\n"
    "\tlea 5(%rdi), %rax\n"
    "\tret\n.cfi_endproc\n.size plain_fn, .-plain_fn\n"
    CN_NOTE("990b", "0", "relr", "plain", "8@%rdi")
    ".section .data.rel.ro,\"aw\"\n.p2align 3\n"
    ".globl relr_table\nrelr_table: .quad .Lrelr_after\n.quad plain_fn\n"
    ".text\n");

long relr_fn(long);
long plain_fn(long);
extern long (*const relr_table[2])(long);

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000, s = 0;
    for (long i = 0; i < n; i++)
        s += relr_fn(i) + relr_table[0](i) + relr_table[1](i) + plain_fn(i);
    printf("%ld\n", s);
    return 0;
}
