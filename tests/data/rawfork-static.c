/* rawfork-static.c: a static program that forks through its own system call (issue 19,
 * item 3), `mov $57,%eax` and `syscall` with another instruction between them: the guard
 * cannot hook it, so rewrite --fork-guard auto refuses the file. The C library's fork is not
 * linked. The child exits at once through the exit system call. */
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
    asm volatile("mov $57, %%eax\n\txor %%edi, %%edi\n\tsyscall"
                 : "=a"(ret) :: "rdi", "rcx", "r11", "memory");
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
