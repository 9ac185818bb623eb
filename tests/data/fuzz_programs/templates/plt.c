/* Build: gcc -O2 -fPIC -shared -o libfzplt.so plt-lib.c && gcc -O2 -o plt plt.c -L. -lfzplt -Wl,-rpath,'$ORIGIN' (tools/fuzz_programs.py turns the PROBE markers into probes) */
/* A program that calls a shared library through the PLT, probes on both sides. */
#include <stdio.h>
#include <stdint.h>
#include <sys/sdt.h>

int64_t fzplt_step(int64_t x, int k);
extern int64_t fzplt_calls;

int main(void)
{
    int64_t x = 7;
    for (int k = 0; k < 500; k++) {
        x = fzplt_step(x, k);
        /*@PROBE x, k*/
    }
    /*@PROBE x, fzplt_calls*/
    printf("plt %lld %lld\n", (long long)x, (long long)fzplt_calls);
    return 0;
}
