/* forklib.c: a shared library with a probe whose code creates a child through syscall() with
 * a number its caller gives (issue 31: a library's route that skips the atfork handlers, as
 * Ruby's Kernel#syscall): lib_hits(n) hits the probe n times, lib_child(nr) makes the system
 * call nr (SYS_fork or SYS_clone with SIGCHLD) through syscall(); its child hits the probe 7
 * times and exits 0; lib_syscall(nr) makes the system call nr (as lib_child) and returns its
 * result to the caller, in the child too (tests/data/forklib-two.c).
 * Build: gcc -O2 -shared -fPIC -I fixtures/src tests/data/forklib.c -o libforklib.so */
#include <signal.h>
#include <unistd.h>
#include <sys/syscall.h>
#include "custom_note.h"
__attribute__((noinline)) long lib_site(long x)
{
    asm volatile(CN_PROBE("nop", "forklib", "site", "8@%[x]") :: [x] "r"(x));
    return x + 1;
}
long lib_hits(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += lib_site(i);
    return s;
}
long lib_child(long nr)
{
    long pid = syscall(nr, nr == SYS_clone ? SIGCHLD : 0, 0, 0, 0, 0);
    if (pid == 0) {
        lib_hits(7);
        _exit(0);
    }
    return pid;
}
long lib_syscall(long nr)
{
    return syscall(nr, nr == SYS_clone ? SIGCHLD : 0, 0, 0, 0, 0);
}
