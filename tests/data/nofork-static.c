/* nofork-static.c: a static program that never forks (issue 19, item 3): stripped, only its
 * C library's system calls are left to judge. */
#include <stdio.h>
#include <stdlib.h>
#include "custom_note.h"
__attribute__((noinline)) long site(long x)
{
    asm volatile(CN_PROBE("nop", "nofork", "site", "8@%[x]") :: [x] "r"(x));
    return x + 1;
}
int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    long sum = 0;
    for (long k = 0; k < n; k++)
        sum += site(k);
    printf("%ld\n", sum);
    return 0;
}
