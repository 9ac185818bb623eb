/* The driver of liblines.so (lineslib.c; tests/test_rewrite_gdb_lines.py):
   gcc -g linesdrv.c -L. -llines -Wl,-rpath,'$ORIGIN' -o linesdrv */
#include <stdio.h>
long step(long);
int main(void) {
    long s = 0;
    for (long i = 0; i < 3; i++) s += step(i);
    printf("sum %ld\n", s);
    return (int)(s & 7) + 3;
}
