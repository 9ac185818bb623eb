/* Stack arrays indexed by a register in leaves built with -mno-red-zone and usdtpatch's
   sys/sdt.h without its guard (nop5 sites, optimized as they are):
     cc -O2 -mno-red-zone -Isdt_headers -DUSDTPATCH_REDZONE_GUARD=0 index.c -o index
   table_sum's stores go through (%rsp,%reg,8) with the register counted up from zero (or
   zero-extended): never below %rsp, so its site is not red-zone-live. table_at's index is its
   argument, whose sign nothing in the function shows: its site stays flagged. int_sum counts
   with an int (gcc -O1/-O2/-Os sign-extends it, movslq %eax,%rdx, before each store): the
   counter runs from 0 up, so its sign extension is not negative; int_at's int index is its
   argument, sign-extended: flagged. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

__attribute__((noinline)) long table_sum(long n)
{
    volatile long buf[16];
    for (unsigned i = 0; i < 16; i++)
        buf[i] = n * (long)i;
    DTRACE_PROBE1(rzindex, sum, n);
    long s = 0;
    for (unsigned i = 0; i < 16; i++)
        s += buf[i];
    return s;
}

__attribute__((noinline)) long table_at(long n, long at)
{
    volatile long buf[16];
    for (long i = 0; i < 16; i++)
        buf[i] = n + i;
    buf[at] = n * 3;
    DTRACE_PROBE1(rzindex, at, n);
    return buf[at] + buf[15 - at];
}

__attribute__((noinline)) long int_sum(long n)
{
    volatile long buf[8];
    for (int i = 0; i < 8; i++)
        buf[i] = n * i;
    DTRACE_PROBE1(rzindex, intsum, n);
    long s = 0;
    for (int i = 0; i < 8; i++)
        s += buf[i];
    return s;
}

__attribute__((noinline)) long int_at(long n, int at)
{
    volatile long buf[8];
    for (int i = 0; i < 8; i++)
        buf[i] = n + i;
    buf[at] = n * 3;
    DTRACE_PROBE1(rzindex, intat, n);
    return buf[at] + buf[7 - at];
}

int main(int argc, char **argv)
{
    long total = 0;
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    for (long k = 0; k < rounds; k++)
        total += table_sum(k + argc) + table_at(k, k % 16) + int_sum(k) +
                 int_at(k, (int)(k % 8));
    printf("%ld\n", total);
    return 0;
}
