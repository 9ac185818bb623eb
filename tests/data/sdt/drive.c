/* Drives the probes of probes.c + sema.c (built with -DSDT_FIXTURE_LIB) for the live-kernel
   test: prints "ready", waits for a line on stdin, runs every probe twice, prints "done" and
   waits for another line before exiting (the test reads the sites from /proc/PID/mem then). */
#include <stdio.h>

struct point { int x; long y; double z; };
int all_counts(int a, long b, unsigned c, unsigned long d, short e, unsigned short f,
               signed char g, unsigned char h, char i, long long j, unsigned long long k,
               float l, double m);
int operand_kinds(int idx, struct point *p, int col, int n);
int c99_kinds(_Bool flag, long double ld, int n);
int sema_probes(int n);

int main(void) {
  struct point pts[2] = { { 1, 2, 3.0 }, { 4, 5, 6.0 } };
  char line[16];
  long r = 0;
  int i;
  printf("ready\n");
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin))
    return 1;
  for (i = 0; i < 2; i++) {
    r += all_counts(i, -2, 3u, 4ul, -5, 6, -7, 8, 'x', -10ll, 11ull, 1.5f, -2.25);
    r += operand_kinds(i, pts, 1, 3);
    r += c99_kinds(i > 0, 1.0L, i);
    r += sema_probes(i);
  }
  printf("done %ld\n", r);
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin))
    return 0;
  return 0;
}
