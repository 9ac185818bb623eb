/* retaddr-main.c: runs retaddr.c built as a shared library (-DLIB).
 * Build: gcc -O2 -DLIB -fPIC -shared retaddr.c -o libretaddr.so &&
 *        gcc -O2 retaddr-main.c -L. -lretaddr -Wl,-rpath,'$ORIGIN' -o retaddr-main */
#include <stdlib.h>
long run(int n);
int main(int argc, char **argv) { return (int)run(argc > 1 ? atoi(argv[1]) : 2); }
