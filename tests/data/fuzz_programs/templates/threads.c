/* Build: gcc -O2 -pthread -o threads threads.c (tools/fuzz_programs.py turns the PROBE markers into probes) */
/* Four threads running probed loops; the result does not depend on the schedule. */
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/sdt.h>

static int64_t results[4];

static void *work(void *arg)
{
    int64_t id = (int64_t)(intptr_t)arg;
    int64_t acc = id;
    for (int i = 0; i < 5000; i++) {
        acc = acc * 31 + i;
        /*@PROBE id, i*/
        if ((i & 255) == 0) {
            /*@PROBE id, acc*/
            acc ^= id << 3;
        }
    }
    results[id] = acc;
    /*@PROBE id, acc*/
    return 0;
}

int main(void)
{
    pthread_t t[4];
    for (int64_t k = 0; k < 4; k++)
        pthread_create(&t[k], 0, work, (void *)(intptr_t)k);
    for (int k = 0; k < 4; k++)
        pthread_join(t[k], 0);
    int64_t s = 0;
    for (int k = 0; k < 4; k++) {
        s ^= results[k];
        /*@PROBE k, s*/
    }
    printf("threads %lld\n", (long long)s);
    return 0;
}
