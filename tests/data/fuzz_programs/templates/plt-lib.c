/* Build: gcc -O2 -fPIC -shared -o libfzplt.so plt-lib.c (the library of plt.c) */
#include <stdint.h>
#include <sys/sdt.h>

int64_t fzplt_calls;

int64_t fzplt_step(int64_t x, int k)
{
    fzplt_calls++;
    /*@PROBE x, k, fzplt_calls*/
    if (k % 5 == 0) {
        x ^= x >> 7;
        /*@PROBE x*/
    }
    return x * 5 + k;
}
