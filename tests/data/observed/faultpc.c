/* faultpc.c: SIGSEGV handlers that recognise their expected faults by the faulting pc
 * (issue 30, class 6), each load right after a probe, in the probe's window:
 * - label: the load is at the global label `load_fault` (hotspot's SafeFetch pattern): the
 *   handler compares REG_RIP with it and resumes at `load_resume`;
 * - range: the handler takes a fault whose pc lies in `range_load` (its first 256 bytes) as
 *   expected and siglongjmps out of it;
 * - first: alike for `range_first`, whose probe is its first instruction: every window holds
 *   the load (the site is left alone: window-fault-observed).
 * A fault at any other pc is foreign: the handler says so and exits 3.  Moved into a
 * detour, each load would fault at the detour's pc.  With -DLIB it is a shared library
 * (`run` called by faultpc-main.c).
 * Build: gcc -O2 -I fixtures/src tests/data/observed/faultpc.c -o faultpc */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>
#include "custom_note.h"

extern char load_fault[], load_resume[];
static sigjmp_buf env;
static long expected;

__attribute__((noinline)) long label_load(long *p)
{
    long v = -1;
    __asm__ volatile(CN_PROBE("nop", "faultpc", "label", "8@%[p]")
                     ".globl load_fault\nload_fault: movq (%[p]), %[v]\n"
                     ".globl load_resume\nload_resume:\n"
                     : [v] "+r"(v) : [p] "r"(p) : "memory");
    return v;
}

__attribute__((noinline)) long range_load(long *p)
{
    long v = -1;
    __asm__ volatile(CN_PROBE("nop", "faultpc", "range", "8@%[p]") "movq (%[p]), %[v]\n"
                     : [v] "+r"(v) : [p] "r"(p) : "memory");
    return v;
}

long range_first(long *p);
__asm__(".text\n.globl range_first\n.type range_first, @function\n.p2align 4\n"
        "range_first:\n.cfi_startproc\n"
        "990: nop\n"
        "\tmovq (%rdi), %rax\n"
        "\tret\n.cfi_endproc\n.size range_first, .-range_first\n"
        CN_NOTE("990b", "0", "faultpc", "first", "8@%rdi"));

static void on_segv(int sig, siginfo_t *si, void *ctx)
{
    ucontext_t *uc = ctx;
    uintptr_t pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    (void)sig;
    (void)si;
    if (pc == (uintptr_t)load_fault) {
        expected++;
        uc->uc_mcontext.gregs[REG_RIP] = (greg_t)(uintptr_t)load_resume;
        return;
    }
    if ((pc >= (uintptr_t)range_load && pc < (uintptr_t)range_load + 256) ||
        (pc >= (uintptr_t)range_first && pc < (uintptr_t)range_first + 16)) {
        expected++;
        siglongjmp(env, 1);
    }
    static const char msg[] = "foreign fault\n";
    (void)!write(1, msg, sizeof msg - 1);
    _exit(3);
}

#ifdef LIB
long run(int n)
#else
int main(int argc, char **argv)
#endif
{
#ifndef LIB
    int n = argc > 1 ? atoi(argv[1]) : 2;
    (void)argv;
#endif
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    long good = 42, sum = 0;
    for (int i = 0; i < n; i++) {
        sum += label_load(&good) + label_load((long *)16);
        if (sigsetjmp(env, 1) == 0)
            sum += range_load(&good) + range_load((long *)24);
        if (sigsetjmp(env, 1) == 0)
            sum += range_first(&good) + range_first((long *)32);
    }
    printf("sum %ld, expected faults %ld\n", sum, expected);
    return 0;
}
