/* lookupfork.c: a program with a probe whose only way to a child is a function it looks up
 * by name at run time (issue 31): it imports no fork and needs no library but the C library's,
 * so only its dlsym says it may fork. It hits the probe 5 times, prints "ready", waits for a
 * line, then calls dlsym(RTLD_DEFAULT, argv[1]) ("_Fork", or "syscall" called with SYS_fork);
 * the child hits the probe 7 times and exits 0; it prints the child's status, then waits for
 * stdin to close. Build: gcc -O2 -I fixtures/src tests/data/lookupfork.c -o lookupfork */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include "custom_note.h"
__attribute__((noinline)) long site(long x)
{
    asm volatile(CN_PROBE("nop", "lookup", "site", "8@%[x]") :: [x] "r"(x));
    return x + 1;
}
static long hits(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += site(i);
    return s;
}
int main(int argc, char **argv)
{
    char line[64];
    const char *name = argc > 1 ? argv[1] : "_Fork";
    void *f = dlsym(RTLD_DEFAULT, name);
    if (!f)
        return 2;
    hits(5);
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 3;
    long pid = !strcmp(name, "syscall") ? ((long (*)(long, ...))f)(SYS_fork)
                                         : (long)((pid_t (*)(void))f)();
    if (pid == 0) {
        hits(7);
        _exit(0);
    }
    int st = -1;
    waitpid((int)pid, &st, 0);
    printf("child-status %d canary intact\n", st);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
