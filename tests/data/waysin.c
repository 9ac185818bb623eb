/* waysin.c: ways into probe windows from outside the probed function. */
#include <stdio.h>
#include <stdlib.h>
#include "custom_note.h"

asm(".text\n"
    /* farjmp: the instruction after the probe is the target of a jmp rel32 from
       farjmp_other, 4 KiB away */
    ".globl farjmp\n.type farjmp, @function\n.p2align 4\n"
    "farjmp:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n"
    "990: nop\n"
    ".Lfj_after: add $3, %rax\n"
    "\tret\n.cfi_endproc\n.size farjmp, .-farjmp\n"
    CN_NOTE("990b", "0", "waysin", "farjmp", "8@%rax")
    /* shortjmp: ... of a jmp rel8 from the next function */
    ".globl shortjmp\n.type shortjmp, @function\n.p2align 4\n"
    "shortjmp:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n"
    "990: nop\n"
    ".Lsj_after: add $7, %rax\n"
    "\tret\n.cfi_endproc\n.size shortjmp, .-shortjmp\n"
    CN_NOTE("990b", "0", "waysin", "shortjmp", "8@%rax")
    ".globl shortjmp_other\n.type shortjmp_other, @function\n"
    "shortjmp_other:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $200, %rax\n\tjmp .Lsj_after\n"
    ".cfi_endproc\n.size shortjmp_other, .-shortjmp_other\n"
    /* farcall: ... of a call rel32 from another section */
    ".globl farcall\n.type farcall, @function\n.p2align 4\n"
    "farcall:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n"
    "990: nop\n"
    ".Lfc_after: add $5, %rax\n"
    "\tret\n.cfi_endproc\n.size farcall, .-farcall\n"
    CN_NOTE("990b", "0", "waysin", "farcall", "8@%rax")
    /* datatab: ... is an entry of a table of code pointers in data */
    ".globl datatab\n.type datatab, @function\n.p2align 4\n"
    "datatab:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n"
    "990: nop\n"
    ".Ldt_after: lea 11(%rdi), %rax\n"
    "\tret\n.cfi_endproc\n.size datatab, .-datatab\n"
    CN_NOTE("990b", "0", "waysin", "datatab", "8@%rax")
    ".p2align 4\n.fill 4096, 1, 0xcc\n"
    ".globl farjmp_other\n.type farjmp_other, @function\n"
    "farjmp_other:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n\tjmp .Lfj_after\n"
    ".cfi_endproc\n.size farjmp_other, .-farjmp_other\n"
    ".pushsection waysin_other, \"ax\", @progbits\n"
    ".globl farcall_other\n.type farcall_other, @function\n"
    "farcall_other:\n.cfi_startproc\n"
    "\tsub $8, %rsp\n.cfi_adjust_cfa_offset 8\n"
    "\tmov %rdi, %rax\n\tadd $300, %rax\n\tcall .Lfc_after\n"
    "\tadd $8, %rsp\n.cfi_adjust_cfa_offset -8\n\tret\n"
    ".cfi_endproc\n.size farcall_other, .-farcall_other\n"
    ".popsection\n"
    ".pushsection .data.rel.ro, \"aw\", @progbits\n.p2align 3\n"
    ".globl datatab_entries\ndatatab_entries: .quad .Ldt_after\n"
    ".popsection\n"
    CN_BASE);

long farjmp(long), farjmp_other(long), shortjmp(long), shortjmp_other(long);
long farcall(long), farcall_other(long), datatab(long);
extern long (*const datatab_entries[])(long);

/* a computed goto whose second label follows the probe */
__attribute__((noinline)) long cgoto(long i)
{
    static void *const tbl[] = {&&l0, &&l1, &&l2};
    volatile long r = i * 10;
    goto *tbl[i % 3];
l0:
    asm volatile(CN_PROBE("nop", "waysin", "cgoto", "8@%[r]") :: [r] "r"(r));
l1:
    r += 3;
l2:
    r += 1;
    return r;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (long k = 0; k < n; k++) {
        printf("%ld %ld %ld %ld %ld %ld %ld", farjmp(k), farjmp_other(k), shortjmp(k),
               shortjmp_other(k), farcall(k), farcall_other(k), datatab(k));
        printf(" %ld %ld %ld %ld\n", datatab_entries[0](k), cgoto(3 * k), cgoto(3 * k + 1),
               cgoto(3 * k + 2));
    }
    return 0;
}
