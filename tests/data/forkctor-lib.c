/* forkctor-lib.c: a library whose constructor calls back into the program that loads it
 * (issue 31: a fork before the program's own initializers ran): when the program's argv[1] is
 * "libctor", the constructor calls the program's exported routes_from_ctor(), which hits the
 * program's probe, forks and waits (tests/data/forkroutes.c built with -DWITH_LIBCTOR).
 * glibc passes argc, argv and envp to a shared object's constructors.
 * Build: gcc -O2 -shared -fPIC tests/data/forkctor-lib.c -o libforkctor.so */
#include <string.h>
void routes_from_ctor(void) __attribute__((weak));
__attribute__((constructor)) static void ctor(int argc, char **argv, char **envp)
{
    (void)envp;
    if (argc > 1 && !strcmp(argv[1], "libctor") && routes_from_ctor)
        routes_from_ctor();
}
