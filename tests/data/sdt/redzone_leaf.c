/* A gcc -O0 leaf function keeps its locals in the red zone: they sit at -4, -8 and -16(%rbp)
 * with rsp == rbp (a leaf does not move rsp).  An optimized nop5 hit writes the 32 bytes
 * below rsp (the call's return address and the trampoline's pushes), so a probe there
 * overwrites the locals unless the site is guarded.  main() prints what the leaf returns:
 * traced or not, the output must be the same. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

static unsigned long leaf(unsigned long i) {
  unsigned int magic = 0xdeadbeefu;  /* -4(%rbp) */
  unsigned int step = 3u;            /* -8(%rbp) */
  unsigned long acc = i * 7ul;       /* -16(%rbp) */
  STAP_PROBE2(redzone, leaf, i, acc);
  return ((unsigned long)magic << 32 | step) + acc;
}

int main(int argc, char **argv) {
  unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000;
  unsigned long i;
  for (i = 0; i < n; i++)
    printf("%lx\n", leaf(i));
  return 0;
}
