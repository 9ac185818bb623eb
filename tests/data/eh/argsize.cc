// argsize.cc: a probe between the pushes of a call's stack arguments and the call (issue 30,
// class 1): clang pushes the 7th and 8th arguments (`push %rdi; push %rsi`, recorded by
// DW_CFA_GNU_args_size 16), the probe's nop comes after them, so the window holds the call,
// which moves to the detour; k = 42 throws through it into caller's catch, where the
// unwinder pops the pushed arguments by the args_size of the row it finds.
// Build: clang++ -O2 -o argsize argsize.cc (also g++, -O0 to -O3, -no-pie; -DEH_LIB -shared
// -fPIC for libargsize.so and -DEH_DRIVER for its driver)
#include <sys/sdt.h>
#include <cstdio>
#include <stdexcept>
extern "C" long caller(long a, long b, long c, long d, long e, long f);
#ifndef EH_DRIVER
volatile long sink[32];
__attribute__((noinline)) long many(long a, long b, long c, long d, long e, long f, long g,
                                    long h) {
  if (g == 42) throw std::runtime_error("boom");
  return a + b + c + d + e + f + g + h;
}
extern "C" __attribute__((noinline)) long caller(long a, long b, long c, long d, long e, long f) {
  long r;
  try {
    // a long conditional block before the call: the probe is reached from afar, so no
    // window can end at it and the one that starts at it holds the call
    if (a & 1) { for (int i = 0; i < 32; i++) sink[i] = sink[i] + i; }
    r = many(a, b, c, d, e, f, b, ({ DTRACE_PROBE(eh, argsize); a; }));
  } catch (const std::exception &) {
    r = -1;
  }
  return r;
}
#endif
#ifndef EH_LIB
int main() {
  long t = 0;
  for (long k = 40; k < 44; k++) {
    long v = caller(1, k, 3, 4, 5, 6);
    printf("%ld %ld\n", k, v);
    t += v;
  }
  printf("total %ld\n", t);
  return 0;
}
#endif
