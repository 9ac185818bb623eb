#include <stdio.h>
long bump(long);
int main(int argc, char **argv) { long s = 0; long n = argc > 1 ? 1000000 : 10;
  for (long i = 0; i < n; i++) s += bump(i & 7); printf("%ld\n", s); return 0; }
