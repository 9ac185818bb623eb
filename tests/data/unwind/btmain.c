/* gcc -O2 -o btmain btmain.c -L. -lbtc: the program that calls libbtc.so (btc.c -DLIB);
   argv[1] as btc.c's, 4 calls it 4,000,000 times (perf record). */
#include <stdio.h>
#include <stdlib.h>
extern volatile int boom;
extern volatile long *volatile slots[8];
long lib_entry(long x);
int main(int argc, char **argv) {
    static long v[8];
    for (int k = 0; k < 8; k++) slots[k] = &v[k];
    boom = argc > 1 ? atoi(argv[1]) : 0;
    long r = 0;
    for (long n = boom == 4 ? 4000000 : 1; n > 0; n--)
        r += lib_entry(5);
    printf("%ld\n", r);
    return 0;
}
