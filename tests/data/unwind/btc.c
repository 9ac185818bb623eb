/* gcc -O2 -o btc btc.c; gcc -O2 -shared -fPIC -DLIB -o libbtc.so btc.c: a probe followed by a
   call in a function with a frame of its own (saved registers, locals on the stack); the
   callee aborts (argv[1] 1), stops itself for eu-stack (2), or the moved load after a second
   probe faults (3); 4 runs long (perf record). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>
volatile int boom;
volatile long *volatile slots[8];
__attribute__((noinline)) long leaf_abort(long i, volatile long *keep) {
    if (i == 3 && boom == 1) abort();
    if (i == 3 && boom == 2) raise(SIGSTOP);
    if (i == 3 && boom == 3) slots[3] = 0;
    return i + 1 + (keep[i % 6] & 0);
}
__attribute__((noinline)) long framed(long x, long y) {
    volatile long keep[6] = {x, y, x + y, x * y, x - y, 7};
    long i;
    for (i = 0; i < x; i = leaf_abort(i, keep))
        STAP_PROBE(btc, loop);
    return i + keep[5];
}
__attribute__((noinline)) long loads(long x) {
    volatile long keep[6] = {x, 1, 2, 3, 4, 5};
    long s = 0;
    for (long i = 0; i < x; i++) {
        STAP_PROBE(btc, load);
        s += *slots[i % 8] + keep[i % 6];
    }
    return s;
}
#ifdef LIB
long lib_entry(long x) {
    long r = framed(x, x + 1) + 1;
    return r + loads(x);
}
#else
__attribute__((noinline)) long outer(long x) {
    long r = framed(x, x + 1) + 1;
    return r + loads(x);
}
int main(int argc, char **argv) {
    static long v[8];
    for (int k = 0; k < 8; k++) slots[k] = &v[k];
    boom = argc > 1 ? atoi(argv[1]) : 0;
    printf("%ld\n", outer(boom == 4 ? 20000000 : 5));  /* 4: a long run, for perf record */
    return 0;
}
#endif
