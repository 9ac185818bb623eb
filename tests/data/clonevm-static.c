/* clonevm-static.c: a static program with a probe that forks, then clones a CLONE_VM child on
 * a tiny stack (argv[1] bytes, default 128) with a canary below it (issue 31, class 3): the
 * child shares the parent's memory; nothing below its stack may be written. Prints the
 * forked child's status, the clone child's flag and whether the canary is intact.
 * Build: gcc -O2 -static -I fixtures/src tests/data/clonevm-static.c -o clonevm-static */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include "custom_note.h"
__attribute__((noinline)) long site(long x)
{
    asm volatile(CN_PROBE("nop", "cvm", "site", "8@%[x]") :: [x] "r"(x));
    return x + 1;
}
static volatile int flag;
static int child(void *arg)
{
    (void)arg;
    flag = 1;
    return 0;
}
static unsigned char area[8192] __attribute__((aligned(64)));
int main(int argc, char **argv)
{
    long size = argc > 1 ? atol(argv[1]) : 128;
    long sum = site(1);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        site(2);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    printf("fork child-status %d\n", st);
    memset(area, 0x5a, sizeof area);
    unsigned char *top = area + 4096 + size; /* the stack: [area + 4096, top) */
    pid = clone(child, top, CLONE_VM | SIGCHLD, 0);
    if (pid < 0) {
        perror("clone");
        return 1;
    }
    waitpid(pid, &st, 0);
    int intact = 1;
    for (int i = 0; i < 4096; i++)
        if (area[i] != 0x5a)
            intact = 0;
    printf("clone child-status %d flag %d canary %s sum %ld\n", st, flag,
           intact ? "intact" : "overwritten", sum);
    return 0;
}
