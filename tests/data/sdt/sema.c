/* SDT fixture (C): probes with semaphores, and STAP_PROBEV.  _SDT_HAS_SEMAPHORES makes every
   probe of this file name its semaphore `<provider>_<name>_semaphore` (in section .probes, as
   systemtap's dtrace -h declares them). */
#define _SDT_HAS_SEMAPHORES 1
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L
#define SDT_USE_VARIADIC 1
#endif
#include <sys/sdt.h>

#define SEMA(p, n) unsigned short p##_##n##_semaphore __attribute__((section(".probes")))
SEMA(sema, plain);
SEMA(sema, guarded);
SEMA(sema, twelve);
SEMA(sema, enabled);
SEMA(sema, enabled12);
/* what dtrace -h generates for a probe: the _ENABLED() test of its semaphore */
#define SEMA_ENABLED_ENABLED() __builtin_expect(sema_enabled_semaphore, 0)
#define SEMA_ENABLED12_ENABLED() __builtin_expect(sema_enabled12_semaphore, 0)
#ifdef SDT_USE_VARIADIC
SEMA(sema, v0);
SEMA(sema, v3);
SEMA(sema, v12);
#endif

int sema_probes(int n) {
  int acc = n;
  STAP_PROBE(sema, plain);
  if (sema_guarded_semaphore)
    STAP_PROBE2(sema, guarded, n, acc);
  if (sema_twelve_semaphore)
    STAP_PROBE12(sema, twelve, n, n + 1, n + 2, n + 3, n + 4, n + 5, n + 6, n + 7, n + 8,
                 n + 9, n + 10, n + 11);
  if (SEMA_ENABLED_ENABLED())
    DTRACE_PROBE2(sema, enabled, n, (long)acc);
  if (SEMA_ENABLED12_ENABLED())
    DTRACE_PROBE12(sema, enabled12, n, acc, n + 1, acc + 1, n + 2, acc + 2, n + 3, acc + 3,
                   n + 4, acc + 4, n + 5, &acc);
#ifdef SDT_USE_VARIADIC
  STAP_PROBEV(sema, v0);
  STAP_PROBEV(sema, v3, n, (long)acc, (unsigned char)n);
  STAP_PROBEV(sema, v12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, (short)n);
#endif
  return acc;
}
