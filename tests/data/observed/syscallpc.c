/* syscallpc.c: a seccomp filter that allows getppid only from two system-call instructions,
 * by their pc (issue 30: a system call never runs from a detour).  Each is right after a
 * probe:
 * - ppid_fixed: `mov $110,%eax; nop; syscall; ret`: a window before the probe holds no
 *   system call (the rewrite takes it);
 * - ppid_bare: `nop; mov %edi,%eax; syscall; ret` at the function's start: every window of 5
 *   bytes holds the system call (the site is left alone: window-syscall, unless a stub place
 *   for a short window [nop, mov] is in an 8-bit jump's reach: the syscall then stays).
 * Moved into a detour, the syscall would be refused (EPERM) by the filter.
 * Build: gcc -O2 -I fixtures/src tests/data/observed/syscallpc.c -o syscallpc */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>
#include "custom_note.h"

long ppid_fixed(void);
long ppid_bare(long nr);

__asm__(".text\n"
        ".globl ppid_fixed\n.type ppid_fixed, @function\n.p2align 4\n"
        "ppid_fixed:\n.cfi_startproc\n"
        "\tmov $110, %eax\n"
        "990: nop\n"
        "\tsyscall\n"
        "\tret\n.cfi_endproc\n.size ppid_fixed, .-ppid_fixed\n"
        CN_NOTE("990b", "0", "syscallpc", "fixed", "")
        ".globl ppid_bare\n.type ppid_bare, @function\n.p2align 4\n"
        "ppid_bare:\n.cfi_startproc\n"
        "990: nop\n"
        "\tmov %edi, %eax\n"
        "\tsyscall\n"
        "\tret\n.cfi_endproc\n.size ppid_bare, .-ppid_bare\n"
        CN_NOTE("990b", "0", "syscallpc", "bare", "")
        CN_BASE);

static void allow_getppid_only_from(uint32_t a, uint32_t b)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 110, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, instruction_pointer)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, a, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, b, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        exit(2);
    }
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    long want = getppid();
    (void)argv;
    /* the kernel reports the pc after the syscall instruction */
    allow_getppid_only_from((uint32_t)(uintptr_t)((char *)ppid_fixed + 8),
                            (uint32_t)(uintptr_t)((char *)ppid_bare + 5));
    for (int i = 0; i < n; i++)
        printf("fixed %s, bare %s\n", ppid_fixed() == want ? "ok" : "refused",
               ppid_bare(110) == want ? "ok" : "refused");
    return 0;
}
