/* Build: gcc -O2 -o signal signal.c (tools/fuzz_programs.py turns the PROBE markers into probes) */
/* Probes in a signal handler, raised synchronously, and around the raise. */
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/sdt.h>

static volatile sig_atomic_t g_hits;
static volatile int64_t g_sum;

static void handler(int sig)
{
    g_hits++;
    g_sum += sig * g_hits;
    /*@PROBE sig, g_hits, g_sum*/
}

int main(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = handler;
    sigaction(SIGUSR1, &sa, 0);
    sigaction(SIGUSR2, &sa, 0);
    int64_t x = 0;
    for (int i = 0; i < 200; i++) {
        /*@PROBE i, x*/
        raise(i % 3 ? SIGUSR1 : SIGUSR2);
        x += g_sum & 0xff;
        /*@PROBE x, g_hits*/
    }
    printf("signal %d %lld %lld\n", (int)g_hits, (long long)g_sum, (long long)x);
    return 0;
}
