/* datacode.c: notes whose pc is data in code (issue 19, item 2).
 * intable: a PIC switch table placed in .text right after the indirect jump; the note's pc
 *   is the table's first entry (0x90, decoded as `nop` by a linear sweep).
 * island: a constant island after `ret`, eight 0x90 bytes the function reads.
 * padded: NOP padding after `ret`, inside the function's symbol and FDE, reached by nothing.
 * plain: a control, a probe on code. */
#include <stdio.h>
#include <stdlib.h>
#include "custom_note.h"

asm(".text\n"
    ".globl intable\n.type intable, @function\n.p2align 4\n"
    "intable:\n.cfi_startproc\n"
    "\tmov $3, %eax\n"
    "\tcmp $1, %rdi\n\tja .Lit_ret\n"
    "\tlea .Lit_tab(%rip), %rdx\n"
    "\tmovslq (%rdx,%rdi,4), %rcx\n"
    "\tadd %rdx, %rcx\n"
    "\tjmp *%rcx\n"
    ".p2align 2\n"
    "990:\n.Lit_tab: .long .Lit_c0 - .Lit_tab, .Lit_c1 - .Lit_tab\n"
    ".fill 0x88, 1, 0xcc\n"
    ".Lit_c0: mov $1, %eax\n\tret\n"
    ".Lit_c1: mov $2, %eax\n"
    ".Lit_ret: ret\n"
    ".cfi_endproc\n.size intable, .-intable\n"
    CN_NOTE("990b", "0", "datacode", "intable", "8@%rdi")
    ".globl island\n.type island, @function\n.p2align 4\n"
    "island:\n.cfi_startproc\n"
    "\tmov .Lis_const(%rip), %rax\n\tadd %rdi, %rax\n\tret\n"
    ".p2align 3\n"
    "990:\n.Lis_const: .quad 0x9090909090909090\n"
    ".cfi_endproc\n.size island, .-island\n"
    CN_NOTE("990b", "0", "datacode", "island", "8@%rdi")
    ".globl padded\n.type padded, @function\n.p2align 4\n"
    "padded:\n.cfi_startproc\n"
    "\tlea 5(%rdi), %rax\n\tret\n"
    "990: .fill 9, 1, 0x90\n"
    ".cfi_endproc\n.size padded, .-padded\n"
    CN_NOTE("990b", "0", "datacode", "padded", "8@%rdi")
    ".globl plain\n.type plain, @function\n.p2align 4\n"
    "plain:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n"
    "990: nop\n"
    "\tadd $9, %rax\n\tret\n"
    ".cfi_endproc\n.size plain, .-plain\n"
    CN_NOTE("990b", "0", "datacode", "plain", "8@%rax")
    CN_BASE);

long intable(long), island(long), padded(long), plain(long);

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (long k = 0; k < n; k++)
        printf("%ld %ld %ld %ld %#lx %ld %ld\n", intable(0), intable(1), intable(k + 2),
               island(k), (unsigned long)island(0), padded(k), plain(k));
    return 0;
}
