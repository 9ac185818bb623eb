/* A program with USDT probes, packaged by tests/test_distro_deb.py (debian/) and
   tests/test_distro_rpm.py (../hello-usdt.spec); built by its Makefile:
   gcc -O2 -g -o hello-usdt hello.c */
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

static int total;

static __attribute__((noinline)) int step(int i) {
    total += i * 3;
    STAP_PROBE2(hello, step, i, total);
    return total % 7;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10, odd = 0;
    STAP_PROBE1(hello, start, n);
    for (int i = 0; i < n; i++)
        odd += step(i) & 1;
    STAP_PROBE2(hello, done, total, odd);
    printf("hello-usdt: total %d, odd %d\n", total, odd);
    return 0;
}
