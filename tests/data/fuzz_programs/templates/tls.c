/* Build: gcc -O2 -pthread -o tls tls.c (tools/fuzz_programs.py turns the PROBE markers into probes) */
/* Thread-local variables read and written next to probes, in two threads. */
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/sdt.h>

static __thread int64_t t_acc = 5;
static __thread int t_count;
static int64_t out[2];

static __attribute__((noinline)) void bump(int64_t v)
{
    t_acc = t_acc * 3 + v;
    t_count++;
    /*@PROBE t_acc, t_count, v*/
}

static void *work(void *arg)
{
    int64_t id = (int64_t)(intptr_t)arg;
    for (int i = 0; i < 1000; i++) {
        bump(i + id);
        /*@PROBE t_count, id*/
    }
    out[id] = t_acc ^ t_count;
    return 0;
}

int main(void)
{
    pthread_t t;
    pthread_create(&t, 0, work, (void *)(intptr_t)1);
    work((void *)(intptr_t)0);
    pthread_join(t, 0);
    /*@PROBE t_acc, out[0]*/
    printf("tls %lld %lld %d\n", (long long)out[0], (long long)out[1], t_count);
    return 0;
}
