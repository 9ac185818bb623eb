/* Build: gcc -Os -fno-pie -no-pie -mno-red-zone -fno-omit-frame-pointer -g -o joinback joinback.c
   (tools/fuzz_programs.py's pair 1-1779, switch.c: p3's backward window starts before p2's and
   holds it; the two are joined in one detour; tests/test_rewrite_conversion.py) */
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
    case 3: r -= 11; STAP_PROBE1(fz, p0, (uint64_t)65535LL); break;
    case 4: r = r * 3 + 1; break;
    case 5: /*@PROBE x, k, r, g_total*/ r += k; break;
    case 6: r ^= (r >> 3); break;
    case 7: r += 100; /*@PROBE r*/ break;
    case 8: r -= k * 2; break;
    case 9: r |= 1; STAP_PROBE2(fz, p1, k, (uint8_t)65535LL); break;
    case 10: r &= 0xffffff; break;
    case 11: r += x >> 1; STAP_PROBE3(fz, p2, x, r, (int32_t)32767LL); break;
    default: r = ~r; break;
    }
    STAP_PROBE1(fz, p3, (uint16_t)1LL);
    return r;
}

int main(void)
{
    int64_t x = 1;
    for (unsigned i = 0; i < 300; i++) {
        x = step(i * 7 + (unsigned)(x & 3), x);
        g_total += x & 0xff;
        STAP_PROBE5(fz, p4, g_total, g_total, ((int16_t)((uint64_t)i + (uint64_t)g_total)), (int64_t)-128LL, x);
    }
    printf("switch %lld %lld\n", (long long)x, (long long)g_total);
    return 0;
}
