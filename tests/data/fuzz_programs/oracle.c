/* Build: gcc -O2 -o oracle oracle.c (tests/test_fuzz_programs.py damages its rewrite: the oracle must see it) */
/* Two probes hit a different number of times, one with a constant argument. */
#include <stdio.h>
#include <sys/sdt.h>

static volatile long g_sum;

static __attribute__((noinline)) void add(long i)
{
    g_sum += i * 3;
    STAP_PROBE2(fz, p0, i, 42);
    g_sum ^= i;
}

int main(void)
{
    for (long i = 0; i < 10; i++)
        add(i);
    STAP_PROBE1(fz, p1, g_sum);
    printf("oracle sum=%ld\n", g_sum);
    return 0;
}
