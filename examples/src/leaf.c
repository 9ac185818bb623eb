/* leaf.c: a leaf function (no call, no `sub $N,%rsp`) that keeps live data in the red zone
 * below %rsp across its probe. On a 6.18 kernel every optimized hit writes the 32 bytes below
 * %rsp, so this site needs usdtpatch's red-zone guard (--redzone-guard auto, the default):
 * building with --redzone-guard never --fail-on error must fail. */
#include <sys/sdt.h>

__attribute__((noipa)) long leaf_checksum(long x)
{
    long buf[12];
    for (int i = 0; i < 12; i++)
        buf[i] = x * (i + 1) + i;
    __asm__ volatile("" ::"r"(buf) : "memory");
    DTRACE_PROBE2(app, leaf, x, buf[5]);
    __asm__ volatile("" ::: "memory");
    long s = 0;
    for (int i = 0; i < 12; i++)
        s = s * 3 + buf[i];
    return s;
}
