/* gcc -o dlnames dlnames.c -ldl: dlopen argv[1], then for each further name the address
   dlsym gives less the object's base (dladdr's dli_fbase), or "none". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        puts(dlerror());
        return 1;
    }
    for (int i = 2; i < argc; i++) {
        void *p = dlsym(h, argv[i]);
        Dl_info info;
        if (p && dladdr(p, &info))
            printf("%s %lx\n", argv[i], (unsigned long)((char *)p - (char *)info.dli_fbase));
        else
            printf("%s none\n", argv[i]);
    }
    return 0;
}
