#include <sys/sdt.h>
__thread long counter;
long bump(long x) {
    DTRACE_PROBE1(relay, tls, x);
    counter += x;
    return counter;
}
