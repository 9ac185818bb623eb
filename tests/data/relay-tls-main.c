#include <stdio.h>
#include <stdlib.h>
long bump(long);
/* relay-tls-main [N [OFFSET]]: N calls of bump (10 without N), the sum; with OFFSET, also the
   byte at bump + OFFSET after the loop (0xe8 when the kernel optimized the site there) */
int main(int argc, char **argv) {
    long s = 0, n = argc > 1 ? atol(argv[1]) : 10;
    for (long i = 0; i < n; i++) s += bump(i & 7);
    printf("%ld\n", s);
    if (argc > 2) printf("%02x\n", ((volatile unsigned char *)bump)[atol(argv[2])]);
    return 0;
}
