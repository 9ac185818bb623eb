/* rawfork-static.c: a static program that forks through its own system call (issue 19,
 * item 3), `mov $57,%eax` and `syscall` with another instruction between them: the guard
 * hooks it from the `syscall` on (issue 31; -DJMP_AFTER: a jump lands on the `syscall`, a
 * 5-byte jmp follows it). With -DWAY_IN a jump lands right after the
 * `syscall` (and a branch is right before it): no window can be made, so rewrite
 * --fork-guard auto refuses the file. The C library's fork is not linked. The child hits the
 * probe once, then exits through the exit system call.
 * Build: gcc -O2 -static [-DWAY_IN | -DJMP_AFTER] -I fixtures/src tests/data/rawfork-static.c -o rawfork */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include "custom_note.h"
__attribute__((noinline)) long site(long x)
{
    asm volatile(CN_PROBE("nop", "rawfork", "site", "8@%[x]") :: [x] "r"(x));
    return x + 1;
}
static long raw_fork(void)
{
    long ret;
#if defined(JMP_AFTER)
    /* a way in on the syscall itself (no window before it), then a 5-byte jmp (e9 rel32): the window
     * runs from the syscall through the jmp, which the hook makes to its target */
    asm volatile("mov $57, %%eax\n\txor %%edi, %%edi\n\ttest %%esi, %%esi\n\tjz 1f\n"
                 "1:\tsyscall\n\t.byte 0xe9\n\t.long 2f - 3f\n3:\tud2\n2:\tnop"
                 : "=a"(ret) : "S"(1) : "rdi", "rcx", "r11", "memory");
#elif defined(WAY_IN)
    /* %esi is 1: the jump is never taken, but it is a way in right after the syscall */
    asm volatile("mov $57, %%eax\n\txor %%edi, %%edi\n\ttest %%esi, %%esi\n\tjz 1f\n\t"
                 "syscall\n1:\tnop\n\tnop\n\tnop\n\tnop"
                 : "=a"(ret) : "S"(1) : "rdi", "rcx", "r11", "memory");
#else
    asm volatile("mov $57, %%eax\n\txor %%edi, %%edi\n\tsyscall"
                 : "=a"(ret) :: "rdi", "rcx", "r11", "memory");
#endif
    return ret;
}
int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    long sum = 0;
    for (long k = 0; k < n; k++) {
        sum += site(k);
        fflush(stdout);
        long pid = raw_fork();
        if (pid == 0) {
            site(100 + k);
            asm volatile("mov $60, %%eax\n\txor %%edi, %%edi\n\tsyscall" ::: "memory");
        }
        int st = 0;
        waitpid((int)pid, &st, 0);
        printf("parent %ld child-status %d\n", sum, st);
    }
    return 0;
}
