/* textrel.c: a shared object with a text relocation next to a probe (issue 30, class 3): the
   8 bytes of `movabs $glob` are filled in by the loader (R_X86_64_64 against glob).
   Build: gcc -O2 -shared -fno-pic -Wl,-z,notext textrel.c -o libtextrel.so */
#include <sys/sdt.h>

long glob = 40;

long get(long x)
{
    long *p;
    STAP_PROBE1(textrel, get, x);
    __asm__ volatile("movabs $glob, %0" : "=r"(p));
    return *p + x;
}

long plain(long x)
{
    STAP_PROBE1(textrel, plain, x);
    return x * 3 + 1;
}
