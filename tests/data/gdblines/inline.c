/* An inlined function whose code starts right after the probe (tests/test_rewrite_gdb_lines.py):
   gdb's `break mix` stops at its inlined instance's entry, inside the probe's window.
   gcc|clang -O2 -g inline.c -o inline */
#include <stdio.h>
#include <sys/sdt.h>
volatile long g;
static inline long mix(long x) { return g * 3 + x; }
__attribute__((noinline)) long step(long x) {
    STAP_PROBE1(lines, p, x);
    g = mix(x);
    return g;
}
int main(void) {
    long s = 0;
    for (long i = 0; i < 3; i++) s += step(i);
    printf("sum %ld\n", s);
    return (int)(s & 7) + 3;
}
