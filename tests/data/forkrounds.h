/* forkrounds.h: the program of forkstatic.c and sysfork-static.c (tests/test_fork_static.py):
 * each round the parent and a forked child each hit the probe, the parent waits for the child
 * and prints its status. The includer defines FORK(), how it forks, first. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/wait.h>
#include "custom_note.h"
__attribute__((noinline)) long site(long x)
{
    asm volatile(CN_PROBE("nop", "sfork", "site", "8@%[x]") :: [x] "r"(x));
    return x + 1;
}
int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    long sum = 0;
    for (long k = 0; k < n; k++) {
        sum += site(k);
        fflush(stdout);
        pid_t pid = FORK();
        if (pid == 0) {
            long r = site(100 + k);
            printf("child %ld\n", r);
            fflush(stdout);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        printf("parent %ld child-status %d\n", sum, st);
    }
    return 0;
}
