/* lastfn.c: a probe-only function last in .text, right before .fini (issue 36,
 * window-function-end): `nop; ret` with 2 bytes after it. Build: gcc -O2 -g lastfn.c -o lastfn
 * (or clang; -Os packs it after crtstuff's frame_dummy with no padding, which stays refused).
 * tests/test_rewrite_short_window.py */
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

__attribute__((noinline)) void last_probe(void);

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 3;
    for (long i = 0; i < n; i++)
        last_probe();
    puts("done");
    return 0;
}

__attribute__((noinline)) void last_probe(void)
{
    DTRACE_PROBE(sites, last);
}
