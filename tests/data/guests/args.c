/* A USDT probe with two arguments, built with systemtap's <sys/sdt.h> (a 1-byte nop site):
   the guest sessions run its `usdtpatch rewrite --form combo10` copy untraced (the original's
   output) and traced by bpftrace (every pass, every argument value).  `args N`: N passes,
   then prints the sum of the second argument.  `args N wait`: prints "ready PID" first and
   waits for a line, prints "done" after the passes and waits for a line again (the session's
   site check, tests/guest_session.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/sdt.h>
__attribute__((noinline)) long work(long i) { long b = i * 3 + 1; DTRACE_PROBE2(guest, tick, i, b); return b; }
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000, s = 0;
  int wait = argc > 2 && strcmp(argv[2], "wait") == 0;
  char line[64];
  if (wait) {
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
  }
  for (long i = 0; i < n; i++) s += work(i);
  if (wait) {
    printf("done\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 0;
  }
  printf("sum %ld\n", s);
  return 0;
}
