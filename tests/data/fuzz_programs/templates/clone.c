/* Build: gcc -O2 -o clone clone.c (tools/fuzz_programs.py turns the PROBE markers into probes) */
/* Children made without fork(): vfork, clone with SIGCHLD (a copy of the address space),
   clone with CLONE_VM|CLONE_VFORK on a small stack of its own (the parent's memory), each
   passing probes; every child's result comes back as its exit status. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/sdt.h>

static int64_t g_shared;

static __attribute__((noinline)) int64_t mix(int64_t x, int n)
{
    for (int i = 0; i < n; i++) {
        x = x * 2862933555777941757LL + 3037000493LL;
        /*@PROBE x, i*/
    }
    return x;
}

static int child(void *arg)
{
    int64_t v = mix(*(int64_t *)arg, 20);
    /*@PROBE v*/
    g_shared += v & 0xff; /* seen by the parent only when the memory is shared */
    return (int)(v & 0x7f);
}

static int wait_code(pid_t pid)
{
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, __WALL) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(void)
{
    static char stack[2][16384] __attribute__((aligned(16)));
    int64_t s = mix(7, 30);
    for (int r = 0; r < 6; r++) {
        int64_t arg = s + r;
        /*@PROBE r, s*/
        fflush(stdout);
        pid_t pid;
        switch (r % 3) {
        case 0:
            pid = vfork();
            if (pid == 0)
                _exit(child(&arg));
            break;
        case 1:
            pid = clone(child, stack[0] + sizeof stack[0], SIGCHLD, &arg);
            break;
        default:
            pid = clone(child, stack[1] + sizeof stack[1], CLONE_VM | CLONE_VFORK | SIGCHLD,
                        &arg);
            break;
        }
        int code = wait_code(pid);
        s = mix(s ^ code, 5);
        /*@PROBE s, code*/
    }
    printf("clone %lld %lld\n", (long long)s, (long long)g_shared);
    return 0;
}
