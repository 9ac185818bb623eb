/* retaddr.c: a callee that looks at its return address (issue 30, class 7).  The probe is
 * right before the call and a loop's jump lands on it, so the site's only window holds the
 * call: moved into a detour, the
 * callee would see a return address in the detour.  The callee prints what dladdr names for
 * its return address, what backtrace_symbols prints for its caller's frame (the part in
 * parentheses), and whether the return address lies in the caller's bounds (its first
 * 512 bytes).  With -DLIB it is a shared library (`run` called by retaddr-main.c).
 * Build: gcc -O2 -rdynamic tests/data/observed/retaddr.c -o retaddr */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>

long seen, counter;
void caller(long n);

__attribute__((noinline)) void callee(void)
{
    long x = counter;
    char *ra = __builtin_return_address(0);
    Dl_info info;
    const char *name = dladdr(ra, &info) && info.dli_sname ? info.dli_sname : "?";
    void *frames[4];
    int n = backtrace(frames, 4);
    char **text = backtrace_symbols(frames, n);
    const char *open = n > 1 && text ? strchr(text[1], '(') : NULL;
    const char *close = open ? strchr(open, ')') : NULL;
    int inside = ra >= (char *)caller && ra < (char *)caller + 512;
    printf("callee(%ld): dladdr %s; backtrace %.*s; %s the caller\n", x, name,
           close ? (int)(close - open + 1) : 1, close ? open : "?",
           inside ? "inside" : "outside");
    free(text);
    seen += x;
}

__attribute__((noinline)) void caller(long n)
{
    for (counter = 0; counter < n; counter++) {  /* the loop's jump lands on the probe */
        STAP_PROBE(retaddr, before_call);
        callee();
    }
}

#ifdef LIB
long run(int n)
#else
int main(int argc, char **argv)
#endif
{
#ifndef LIB
    int n = argc > 1 ? atoi(argv[1]) : 2;
    (void)argv;
#endif
    caller(n);
    printf("seen %ld\n", seen);
    return 0;
}
