/* A USDT probe with two arguments, built with systemtap's <sys/sdt.h> (a 1-byte nop site):
   the guest sessions run its `usdtpatch rewrite --form combo10` copy untraced (the original's
   output) and traced by bpftrace (every pass, every argument value).  `args N`: N passes,
   then prints the sum of the second argument. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>
__attribute__((noinline)) long work(long i) { long b = i * 3 + 1; DTRACE_PROBE2(guest, tick, i, b); return b; }
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000, s = 0;
  for (long i = 0; i < n; i++) s += work(i);
  printf("sum %ld\n", s);
  return 0;
}
