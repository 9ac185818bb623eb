/* computed-unknown.c: a jump to a computed address whose base the analysis cannot know (a
 * pointer loaded from data plus an offset) lands after a probe (issue 30, class 4): every
 * function of the file is all-targets. Build: gcc -O2 -fPIE -pie -g0 -I fixtures/src
 * -I tests/data -o computed-unknown tests/data/computed-unknown.c (also -fno-pie -no-pie). */
#include <stdio.h>
#include <stdlib.h>
#include "waysin-asm.h"

asm(".text\n"
    PROBED("plain", ".Lpl_after", "13")
    PROBED("target", ".Ltg_after", "3")
    FUNC("target_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n\tmov anchor(%rip), %rcx\n"
    "\tadd $16, %rcx\n\tjmp *%rcx\n"
    ".cfi_endproc\n" END("target_other")
    CN_BASE
    /* 16 bytes before the instruction after target's probe: no way in, as it is */
    ".section .data.rel.ro,\"aw\"\n.p2align 3\nanchor: .quad .Ltg_after - 16\n.text\n");

long plain(long), target(long), target_other(long);

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (long k = 0; k < n; k++)
        printf("%ld %ld %ld\n", plain(k), target(k), target_other(k));
    return 0;
}
