/* Build: gcc -O2 -o jmp jmp.c (tools/fuzz_programs.py turns the PROBE markers into probes) */
/* setjmp/longjmp out of nested frames with probes. */
#include <setjmp.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/sdt.h>

static jmp_buf env;
static volatile int64_t g_depth;

static __attribute__((noinline)) void dive(int n, int64_t acc)
{
    g_depth = n;
    /*@PROBE n, acc*/
    if (n == 0)
        longjmp(env, (int)(acc & 0x7f) + 1);
    dive(n - 1, acc * 3 + n);
    /*@PROBE n*/
}

int main(void)
{
    int64_t total = 0;
    for (volatile int i = 0; i < 100; i++) {
        int r = setjmp(env);
        if (r == 0) {
            /*@PROBE i*/
            dive(i % 9, i);
        } else {
            total += r;
            /*@PROBE r, total, g_depth*/
        }
    }
    printf("jmp %lld\n", (long long)total);
    return 0;
}
