// g++ -O2 -o btx btx.cc: a probe followed by a call whose callee throws (gdb: catch throw).
#include <cstdio>
#include <stdexcept>
#include <sys/sdt.h>
volatile int boom;
__attribute__((noinline)) long thrower(long i, volatile long *keep) {
    if (i == 3 && boom) throw std::runtime_error("boom");
    return i + 1 + (keep[i % 6] & 0);
}
__attribute__((noinline)) long framed(long x, long y) {
    volatile long keep[6] = {x, y, x + y, x * y, x - y, 7};
    long i;
    for (i = 0; i < x; i = thrower(i, keep))
        STAP_PROBE(btx, p);
    return i + keep[5];
}
int main(int argc, char **) {
    boom = argc == 1;
    try {
        std::printf("%ld\n", framed(5, 6));
    } catch (const std::exception &e) {
        std::printf("caught %s\n", e.what());
    }
    return 0;
}
