/* forkroutes.c: a program with a probe that creates a child by the route argv[1] names
 * (issue 31): fork, _Fork, clone (without CLONE_VM, SIGCHLD), sysfork (syscall(SYS_fork)),
 * sysclone (syscall(SYS_clone, SIGCHLD, 0...)), sysclone3 (syscall(SYS_clone3, ...)), vfork,
 * spawn (posix_spawn of /bin/true), clonevm (CLONE_VM on a 128-byte stack, a canary below),
 * pointer (syscall(SYS_fork) through a pointer to syscall taken at run time), and through
 * pointers that dlsym(RTLD_DEFAULT, ...) returns: dlfork (glibc's _Fork, musl's fork),
 * dlsyscall (syscall(SYS_fork)), dlclone (clone, SIGCHLD), dldlsym (dlsym looked up by dlsym,
 * then _Fork / fork through it), dlvsym (glibc: dlvsym of syscall@GLIBC_2.2.5, SYS_fork);
 * preinit: the whole exchange, fork() included, in a .preinit_array function (glibc runs it
 * before every other initializer of the process; musl runs none: the route is glibc's);
 * libctor (built with -DWITH_LIBCTOR -rdynamic, linked with -Wl,--no-as-needed to
 * tests/data/forkctor-lib.c's library): the same exchange in that library's constructor, which calls back into this
 * program (routes_from_ctor) before this program's own initializers (-DNO_PREINIT: the
 * program has no preinit array, so the rewrite gives it one).
 * It hits the probe 5 times, prints "ready", waits for a line, creates the child (which hits
 * the probe 7 times and exits 0), prints the child's status, then waits for stdin to close.
 * Build: gcc -O2 [-static] -I fixtures/src tests/data/forkroutes.c -o forkroutes
 * (musl-gcc for musl; -DNO_DLSYM for a static glibc executable, whose dlsym is left out) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include "custom_note.h"
#ifndef CLONE_ARGS_SIZE_VER0
struct clone_args {
    unsigned long long flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size,
        tls;
};
#endif
extern char **environ;
__attribute__((noinline)) long site(long x)
{
    asm volatile(CN_PROBE("nop", "routes", "site", "8@%[x]") :: [x] "r"(x));
    return x + 1;
}
static long hits(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += site(i);
    return s;
}
static int in_child(void *arg)
{
    (void)arg;
    hits(7);
    return 0;
}
static unsigned char area[8192] __attribute__((aligned(64)));
static unsigned char stack[65536] __attribute__((aligned(16)));
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)
#define HAVE__FORK 1
#define FORK_NAME "_Fork"
#else
#define FORK_NAME "fork"
#endif
#ifndef NO_DLSYM
typedef pid_t (*fork_fn)(void);
typedef long (*syscall_fn)(long, ...);
typedef int (*clone_fn)(int (*)(void *), void *, int, void *, ...);
typedef void *(*dlsym_fn)(void *, const char *);
static pid_t by_lookup(const char *route)
{
    if (!strcmp(route, "dlfork"))
        return ((fork_fn)dlsym(RTLD_DEFAULT, FORK_NAME))();
    if (!strcmp(route, "dlsyscall"))
        return (pid_t)((syscall_fn)dlsym(RTLD_DEFAULT, "syscall"))(SYS_fork);
    if (!strcmp(route, "dlclone"))
        return ((clone_fn)dlsym(RTLD_DEFAULT, "clone"))(in_child, stack + sizeof stack,
                                                       SIGCHLD, 0);
    if (!strcmp(route, "dldlsym")) {
        dlsym_fn look = (dlsym_fn)dlsym(RTLD_DEFAULT, "dlsym");
        return ((fork_fn)look(RTLD_DEFAULT, FORK_NAME))();
    }
#ifdef __GLIBC__
    if (!strcmp(route, "dlvsym"))
        return (pid_t)((syscall_fn)dlvsym(RTLD_DEFAULT, "syscall", "GLIBC_2.2.5"))(SYS_fork);
#endif
    return -2;
}
#endif
/* the preinit route: raw reads and writes (the C library is not initialized yet) */
static void say(const char *s)
{
    if (write(1, s, strlen(s)) < 0)
        _exit(4);
}
static void exchange(void)
{
    hits(5);
    say("ready\n");
    char c;
    do {
        if (read(0, &c, 1) != 1)
            _exit(3);
    } while (c != '\n');
    pid_t pid = fork();
    if (pid == 0) {
        hits(7);
        _exit(0);
    }
    int st = -1;
    waitpid(pid, &st, 0);
    char line[64];
    snprintf(line, sizeof line, "child-status %d canary intact\n", st);
    say(line);
}
__attribute__((unused)) static void early(int argc, char **argv, char **envp)
{
    (void)envp;
    if (argc > 1 && !strcmp(argv[1], "preinit"))
        exchange();
}
#ifdef WITH_LIBCTOR
void routes_from_ctor(void)
{
    exchange();
}
#endif
#ifndef NO_PREINIT
__attribute__((section(".preinit_array"), used)) static void (*early_entry)(int, char **,
                                                                          char **) = early;
#endif
int main(int argc, char **argv)
{
    const char *route = argc > 1 ? argv[1] : "fork";
    char line[64];
    if (strcmp(route, "preinit") && strcmp(route, "libctor")) {
        hits(5);
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 3;
    }
    pid_t pid = -1;
    if (!strcmp(route, "preinit") || !strcmp(route, "libctor")) {
        while (fgets(line, sizeof line, stdin))
            ;
        return 0;
    }
    if (!strcmp(route, "fork"))
        pid = fork();
#ifdef HAVE__FORK
    else if (!strcmp(route, "_Fork"))
        pid = _Fork();
#endif
    else if (!strcmp(route, "vfork")) {
        pid = vfork();
        if (pid == 0)
            _exit(0);
    } else if (!strcmp(route, "sysfork"))
        pid = (pid_t)syscall(SYS_fork);
    else if (!strcmp(route, "pointer")) {
        long (*volatile fp)(long, ...) = syscall;
        pid = (pid_t)fp(SYS_fork);
    } else if (!strcmp(route, "sysclone"))
        pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    else if (!strcmp(route, "sysclone3")) {
        struct clone_args ca;
        memset(&ca, 0, sizeof ca);
        ca.exit_signal = SIGCHLD;
        pid = (pid_t)syscall(SYS_clone3, &ca, sizeof ca);
    } else if (!strcmp(route, "clone")) {
        pid = clone(in_child, stack + sizeof stack, SIGCHLD, 0);
    } else if (!strcmp(route, "clonevm")) {
        memset(area, 0x5a, sizeof area);
        pid = clone(in_child, area + 4096 + 128, CLONE_VM | SIGCHLD, 0);
    }
#ifndef NO_DLSYM
    else if (!strncmp(route, "dl", 2)) {
        pid = by_lookup(route);
        if (pid == -2) {
            fprintf(stderr, "unknown route %s\n", route);
            return 2;
        }
    }
#endif
    else if (!strcmp(route, "spawn")) {
        char *args[] = {"true", 0};
        if (posix_spawn(&pid, "/bin/true", 0, 0, args, environ))
            pid = -1;
    } else {
        fprintf(stderr, "unknown route %s\n", route);
        return 2;
    }
    if (pid == 0) {
        hits(7);
        _exit(0);
    }
    if (pid < 0) {
        perror(route);
        return 1;
    }
    int st = -1;
    waitpid(pid, &st, 0);
    int intact = 1;
    if (!strcmp(route, "clonevm"))
        for (int i = 0; i < 4096; i++)
            intact &= area[i] == 0x5a;
    printf("child-status %d canary %s\n", st, intact ? "intact" : "overwritten");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
