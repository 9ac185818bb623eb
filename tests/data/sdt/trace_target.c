/* Live-kernel target (tests/test_sdt_kernel.py): a probe with arguments of several kinds,
   guarded by a semaphore.  Protocol: prints "ready", waits for a line on stdin (the test sends
   it once the tracer has attached: every site holds the kernel's int3, which the kernel writes
   after raising the probe's semaphore), prints "nosem" and exits 2 if a semaphore is still
   down, else runs N iterations printing what each probe passes ("S v0 .. v5" for target:step,
   "P v0 v1" for target:pair, as signed 64-bit numbers), prints "done", then waits for a line
   on stdin before exiting (so the test can read /proc/PID/mem while the probe is still
   attached). */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <stdio.h>
#include <stdlib.h>

unsigned short target_step_semaphore __attribute__((section(".probes")));
unsigned short target_pair_semaphore __attribute__((section(".probes")));
long g_scale = 3;

__attribute__((noinline)) long step(long i, int k, unsigned char c, short s) {
  volatile long local = i * 7 - 1000;
  long a = i * g_scale;
  int b = k - 7;
  if (target_step_semaphore) {
    /* bpftrace 0.17 reads at most 6 arguments (arg0..arg5) */
    STAP_PROBE6(target, step, a, b, c, local, g_scale, -5);
    printf("S %ld %ld %ld %ld %ld %ld\n", a, (long)b, (long)c, (long)local, g_scale, -5L);
  }
  if (target_pair_semaphore) {
    STAP_PROBE2(target, pair, i, s);
    printf("P %ld %ld\n", i, (long)s);
  }
  return a + b + local;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100, i, sum = 0;
  char line[16];
  printf("ready\n");
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin))
    return 2;
  if (!target_step_semaphore || !target_pair_semaphore) {
    printf("nosem\n");
    return 2;
  }
  for (i = 0; i < n; i++)
    sum += step(i, (int)(i % 50), (unsigned char)(i * 13), (short)(-i * 3));
  printf("done %ld\n", sum);
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin))
    return 0;
  return 0;
}
