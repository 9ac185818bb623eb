/* gcc -O2 -o btmain btmain.c -L. -lbtc: the program that calls libbtc.so (btc.c -DLIB). */
#include <stdio.h>
#include <stdlib.h>
extern volatile int boom;
extern volatile long *volatile slots[8];
long lib_entry(long x);
int main(int argc, char **argv) {
    static long v[8];
    for (int k = 0; k < 8; k++) slots[k] = &v[k];
    boom = argc > 1 ? atoi(argv[1]) : 0;
    printf("%ld\n", lib_entry(5));
    return 0;
}
