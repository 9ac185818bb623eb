/* forklib-main.c: the program of forklib.c (tests/test_fork_routes.py): hits the library's
 * probe 5 times, prints "ready", waits for a line, has the library create a child through
 * syscall(argv[1]: "fork" or "clone"), prints its status, then waits for stdin to close.
 * Build: gcc -O2 tests/data/forklib-main.c -L. -lforklib -Wl,-rpath,'$ORIGIN' -o forklib */
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
long lib_hits(long n);
long lib_child(long nr);
int main(int argc, char **argv)
{
    char line[64];
    long nr = argc > 1 && !strcmp(argv[1], "clone") ? SYS_clone : SYS_fork;
    lib_hits(5);
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 3;
    long pid = lib_child(nr);
    int st = -1;
    if (pid > 0)
        waitpid((int)pid, &st, 0);
    printf("child-status %d canary intact\n", st);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
