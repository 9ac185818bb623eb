/* A probe, then the statement gdb's `break lines.c:N` (N: the marked line) stops at (tests/test_rewrite_gdb_lines.py):
   gcc|clang -O0|-O2|-O3 -gdwarf-4|-gdwarf-5 [-no-pie] lines.c -o lines  (systemtap's sys/sdt.h: 1-byte sites) */
#include <stdio.h>
#include <sys/sdt.h>
volatile long g;
__attribute__((noinline)) long step(long x) {
    STAP_PROBE1(lines, p, x);
    g = g * 3 + x; /* LINE_AFTER */
    return g;
}
int main(void) {
    long s = 0;
    for (long i = 0; i < 3; i++) s += step(i);
    printf("sum %ld\n", s);
    return (int)(s & 7) + 3;
}
