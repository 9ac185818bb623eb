/* SDT fixture (C, valid from C89 to C2x): probes with 0..12 arguments and every operand kind
   the compilers produce (registers of each width, immediates, symbol immediates, rbp/rsp
   relative memory, rip-relative globals, base+index*scale, floating point), built once with
   systemtap's <sys/sdt.h> and once with usdtpatch's (tests/test_sdt_notes.py).
   Define SDT_FIXTURE_LIB to build it into a shared library (no main). */
#include <sys/sdt.h>
#include <stddef.h>

enum color { RED, GREEN, BLUE };
enum sign { NEG = -1, POS = 1 };
struct point { int x; long y; double z; };

int g_int = 7;
long g_long[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
unsigned short g_ushort = 9;
signed char g_schar = -3;
double g_double = 2.5;
struct point g_point = { 1, 2, 3.0 };
const char *g_str = "hello";

extern int sema_probes(int n); /* sema.c */

static int leaf(int a, long b) {
  STAP_PROBE2(fix, leaf, a, b);
  return a + (int)b;
}

int all_counts(int a, long b, unsigned c, unsigned long d, short e, unsigned short f,
               signed char g, unsigned char h, char i, long long j, unsigned long long k,
               float l, double m) {
  STAP_PROBE(fix, args0);
  STAP_PROBE1(fix, args1, a);
  STAP_PROBE2(fix, args2, a, b);
  STAP_PROBE3(fix, args3, a, b, c);
  STAP_PROBE4(fix, args4, a, b, c, d);
  STAP_PROBE5(fix, args5, a, b, c, d, e);
  STAP_PROBE6(fix, args6, a, b, c, d, e, f);
  STAP_PROBE7(fix, args7, a, b, c, d, e, f, g);
  STAP_PROBE8(fix, args8, a, b, c, d, e, f, g, h);
  STAP_PROBE9(fix, args9, a, b, c, d, e, f, g, h, i);
  STAP_PROBE10(fix, args10, a, b, c, d, e, f, g, h, i, j);
  STAP_PROBE11(fix, args11, a, b, c, d, e, f, g, h, i, j, k);
  STAP_PROBE12(fix, args12, a, b, c, d, e, f, g, h, i, j, k, l);
  STAP_PROBE12(fix, args12b, m, l, k, j, i, h, g, f, e, d, c, b);
  return a + (int)b;
}

int operand_kinds(int idx, struct point *p, enum color col, int n) {
  volatile int vol = n * 3;
  volatile long vols[4];
  int i, sum = 0;
  vols[0] = n; vols[1] = n + 1; vols[2] = n + 2; vols[3] = n + 3;
  STAP_PROBE3(fix, immediates, 42, -42, 0x7fffffffL);
  STAP_PROBE3(fix, symbols, &g_int, g_long, "literal");
  STAP_PROBE4(fix, globals, g_int, g_ushort, g_schar, g_double);
  STAP_PROBE3(fix, indexed, g_long[idx & 7], p->y, p[idx & 1].x);
  STAP_PROBE3(fix, stack, vol, vols[idx & 3], vols[1]);
  STAP_PROBE4(fix, structs, p->x, p->z, g_point.y, &g_point);
  STAP_PROBE3(fix, enums, col, (enum sign)n, BLUE);
  STAP_PROBE2(fix, pointers, p, g_str);
  STAP_PROBE2(fix, nullptrs, (void *)0, (const char *)NULL);
  for (i = 0; i < n; i++) {
    sum += leaf(i, (long)idx * i);
    STAP_PROBE2(fix, loop, i, sum);
  }
  DTRACE_PROBE(fix, dtrace0);
  DTRACE_PROBE3(fix, dtrace3, sum, idx, p);
  DTRACE_PROBE12(fix, dtrace12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
  return sum + vol;
}

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L
int c99_kinds(_Bool flag, long double ld, int n) {
  STAP_PROBE2(fix, c99, flag, (long long)n << 33);
  STAP_PROBE1(fix, longdouble, ld); /* fits no general register: never guarded */
  return flag ? n : -n;
}
#endif

#ifndef SDT_FIXTURE_LIB
int main(int argc, char **argv) {
  struct point pts[2] = { { 1, 2, 3.0 }, { 4, 5, 6.0 } };
  int r;
  (void)argv;
  r = all_counts(argc, -2, 3u, 4ul, -5, 6, -7, 8, 'x', -10ll, 11ull, 1.5f, -2.25);
  r += operand_kinds(argc, pts, GREEN, argc + 2);
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L
  r += c99_kinds(argc > 0, 1.0L, argc);
#endif
  r += sema_probes(argc);
  return r == 12345;
}
#endif
