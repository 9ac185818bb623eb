/* main.c: calls libtextrel.so's functions and prints what they return.
   Build: gcc -O2 main.c -L. -ltextrel -Wl,-rpath,'$ORIGIN' -o textrel-main */
#include <stdio.h>
#include <stdlib.h>

long get(long x);
long plain(long x);

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000, s = 0;
    for (long i = 0; i < n; i++)
        s += get(i) + plain(i);
    printf("%ld\n", s);
    return 0;
}
