/* symlabel-main.c: calls symlabel.c's exported labels (built with -DLIB as libsymlabel.so)
 * from another object, through the PLT (issue 46, class 2). */
#include <stdio.h>
#include <stdlib.h>

long plain(long), notype(long), notype_entry(long), object(long), object_entry(long);
long weak(long), weak_entry(long), local(long);

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (long k = 0; k < n; k++)
        printf("%ld %ld %ld %ld %ld %ld %ld %ld\n", plain(k), notype(k), notype_entry(k),
               object(k), object_entry(k), weak(k), weak_entry(k), local(k));
    return 0;
}
