/* app.c: a small program with USDT probes, built with systemtap's <sys/sdt.h> (1-byte NOP
 * sites) by the CMake, Meson and Make examples, which then rewrite it at link time. */
#include <stdio.h>
#include <sys/sdt.h>

long leaf_checksum(long x); /* leaf.c: a probe in a red-zone leaf function */

static __attribute__((noinline)) double average(const long *v, int n)
{
    long total = 0;
    for (int i = 0; i < n; i++) {
        total += v[i];
        DTRACE_PROBE2(app, item, i, v[i]);
    }
    double avg = n ? (double)total / n : 0.0;
    DTRACE_PROBE3(app, average, n, total, avg);
    return avg;
}

int main(int argc, char **argv)
{
    long v[16];
    unsigned long sum = 0;
    for (int i = 0; i < 16; i++)
        v[i] = (long)i * argc + 3;
    DTRACE_PROBE2(app, start, argc, argv[0]);
    for (long i = 0; i < 100; i++)
        sum = sum * 31 + (unsigned long)leaf_checksum(i);
    printf("app: average=%.2f checksum=%lu\n", average(v, 16), sum);
    DTRACE_PROBE1(app, done, sum);
    return 0;
}
