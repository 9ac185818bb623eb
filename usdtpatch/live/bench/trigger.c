/* trigger.c: usdtpatch bench's trigger program (built at run time with the system cc).
 * One USDT site, bench:hit, in a function the loop calls ITERATIONS times.  The program
 * prints "ready", waits for a line on stdin (the harness attaches its uprobe meanwhile),
 * runs the loop and prints "ns=<elapsed nanoseconds> sum=<checksum>".
 * Which sys/sdt.h (systemtap's, or usdtpatch's with -DUSDTPATCH_SITE_FORM=...) decides the
 * site's bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/sdt.h>

__attribute__((noipa)) long trigger(long i)
{
    DTRACE_PROBE1(bench, hit, i);
    return i ^ 0x5a;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    char line[16];
    struct timespec a, b;
    long sum = 0;

    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 2;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        sum += trigger(i);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("ns=%lld sum=%ld\n",
           (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec), sum);
    return 0;
}
