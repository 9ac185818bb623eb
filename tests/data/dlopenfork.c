/* dlopenfork.c: a program with a probe that imports no fork, needs no library but the C
 * library's, and calls dlopen (a library it loads may fork the process: issue 31). Built only
 * to be checked and rewritten, not run. Build: gcc -O2 -I fixtures/src tests/data/dlopenfork.c -o dlopenfork */
#include <dlfcn.h>
#include <stdio.h>
#include "custom_note.h"
__attribute__((noinline)) long site(long x)
{
    asm volatile(CN_PROBE("nop", "dlopen", "site", "8@%[x]") :: [x] "r"(x));
    return x + 1;
}
int main(int argc, char **argv)
{
    void *h = argc > 1 ? dlopen(argv[1], RTLD_NOW) : NULL;
    printf("%ld %p\n", site(argc), h);
    return 0;
}
