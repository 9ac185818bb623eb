/* Build: gcc -O2 -o switch switch.c (tools/fuzz_programs.py turns the PROBE markers into probes) */
/* A dense switch that compiles to a jump table, probes in its cases and around it. */
#include <stdio.h>
#include <stdint.h>
#include <sys/sdt.h>

static int64_t g_total;

static __attribute__((noinline)) int64_t step(unsigned k, int64_t x)
{
    int64_t r = x;
    switch (k % 13) {
    case 0: r += 3; /*@PROBE k, r, x*/ break;
    case 1: r ^= 0x55; /*@PROBE r, k*/ break;
    case 2: r *= 7; break;
    case 3: r -= 11; /*@PROBE r*/ break;
    case 4: r = r * 3 + 1; break;
    case 5: /*@PROBE x, k, r, g_total*/ r += k; break;
    case 6: r ^= (r >> 3); break;
    case 7: r += 100; /*@PROBE r*/ break;
    case 8: r -= k * 2; break;
    case 9: r |= 1; /*@PROBE k*/ break;
    case 10: r &= 0xffffff; break;
    case 11: r += x >> 1; /*@PROBE r, x*/ break;
    default: r = ~r; break;
    }
    /*@PROBE k, r*/
    return r;
}

int main(void)
{
    int64_t x = 1;
    for (unsigned i = 0; i < 300; i++) {
        x = step(i * 7 + (unsigned)(x & 3), x);
        g_total += x & 0xff;
        /*@PROBE i, x, g_total*/
    }
    printf("switch %lld %lld\n", (long long)x, (long long)g_total);
    return 0;
}
