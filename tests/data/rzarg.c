/* rzarg.c: a leaf that keeps data in the red zone across a probe whose note describes a
 * 24-byte argument through %rsp (a size the note format does not fix: `24@-24(%rsp)`) next
 * to an 8-byte one (issue 19, item 5). Under the red-zone guard both must move by +128. */
#include <stdio.h>
#include <stdlib.h>
#include "custom_note.h"

asm(".text\n.globl rzarg\n.type rzarg, @function\n.p2align 4\n"
    "rzarg:\n.cfi_startproc\n"
    "\tmov %rdi, -24(%rsp)\n\tlea 1(%rdi), %rax\n\tmov %rax, -16(%rsp)\n"
    "\tlea 2(%rdi), %rax\n\tmov %rax, -8(%rsp)\n"
    "990: nop\n"
    "\tmov -8(%rsp), %rax\n\timul -16(%rsp), %rax\n\tadd -24(%rsp), %rax\n\tret\n"
    ".cfi_endproc\n.size rzarg, .-rzarg\n"
    CN_NOTE("990b", "0", "rzarg", "site", "24@-24(%rsp) 8@-8(%rsp)")
    CN_BASE);

long rzarg(long);

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    unsigned long sum = 0;
    for (long i = 0; i < n; i++)
        sum = sum * 31 + (unsigned long)rzarg(i);
    printf("rzarg: sum=%lu\n", sum);
    return 0;
}
