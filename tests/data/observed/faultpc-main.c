/* faultpc-main.c: runs faultpc.c built as a shared library (-DLIB).
 * Build: gcc -O2 -DLIB -fPIC -shared faultpc.c -o libfaultpc.so &&
 *        gcc -O2 faultpc-main.c -L. -lfaultpc -Wl,-rpath,'$ORIGIN' -o faultpc-main */
#include <stdlib.h>
long run(int n);
int main(int argc, char **argv) { return (int)run(argc > 1 ? atoi(argv[1]) : 2); }
