/* SDT fixture (C, valid from C89 on): the forms of systemtap's <sys/sdt.h> that probes.c and
   sema.c do not use.  Quoted provider and probe names (bpftrace's usdt_quoted_probe.c writes
   DTRACE_PROBE1(test, "probe1", a): the note's name is then "probe1" with its quotes),
   names that are macros, and arguments that fit no general register (long double, 16-byte
   and odd-sized structs, _Complex, __int128), which systemtap's "nor" constraint puts in
   memory.  (No semaphores here: a quoted name makes no semaphore symbol, in either header;
   sema.c has the dtrace -h style _ENABLED() form.) */
#include <sys/sdt.h>

#define NAME_MACRO expanded_name

struct pair16 { long a, b; };
struct three { char c[3]; };
struct pair16 g_pair16 = { 1, 2 };
struct three g_three = { { 1, 2, 3 } };
long double g_ld = 1.5L;
__extension__ __int128 g_i128 = 5;
__extension__ _Complex double g_cd;

int forms_probes(int n) {
  int a = n;
  long b = n * 3L;
  DTRACE_PROBE1(test, "probe1", a);
  STAP_PROBE2("quoted provider", plain, a, b);
  STAP_PROBE1(forms, NAME_MACRO, a);
  STAP_PROBE5(forms, odd, g_ld, g_pair16, g_three, g_i128, g_cd);
  STAP_PROBE2(forms, mixed, a, g_pair16);
  return a + (int)b;
}
