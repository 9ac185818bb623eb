/* forklib-two.c: two rewritten objects with probes in one process (issue 31): this program's
 * probe and libforklib.so's (tests/data/forklib.c). It hits each 5 times, prints "ready",
 * waits for a line, then creates a child through syscall(SYS_fork) made by the route argv[1]
 * names: "exe" (this program's own call of syscall()) or "lib" (the library's lib_syscall);
 * the child hits both probes 7 times and exits 0; it prints the child's status, then waits
 * for stdin to close. Build: gcc -O2 -I fixtures/src tests/data/forklib-two.c -L.
 * -lforklib -Wl,-rpath,'$ORIGIN' -o two */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include "custom_note.h"
long lib_hits(long n);
long lib_syscall(long nr);
__attribute__((noinline)) long site(long x)
{
    asm volatile(CN_PROBE("nop", "two", "site", "8@%[x]") :: [x] "r"(x));
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
    int lib = argc > 1 && !strcmp(argv[1], "lib");
    hits(5);
    lib_hits(5);
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 3;
    long pid = lib ? lib_syscall(SYS_fork) : syscall(SYS_fork);
    if (pid == 0) {
        hits(7);
        lib_hits(7);
        _exit(0);
    }
    int st = -1;
    if (pid > 0)
        waitpid((int)pid, &st, 0);
    printf("child-status %d canary intact\n", st);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
