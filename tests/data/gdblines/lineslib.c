/* The same in a shared object (tests/test_rewrite_gdb_lines.py), driven by linesdrv.c:
   gcc|clang -O0|-O2 -g -fPIC -shared lineslib.c -o liblines.so
   gcc -g linesdrv.c -L. -llines -Wl,-rpath,'$ORIGIN' -o linesdrv */
#include <sys/sdt.h>
volatile long g;
long step(long x) {
    STAP_PROBE1(lines, p, x);
    g = g * 3 + x; /* LINE_AFTER */
    return g;
}
