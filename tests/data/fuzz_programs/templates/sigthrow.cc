// Build: g++ -O2 -fnon-call-exceptions -o sigthrow sigthrow.cc (tools/fuzz_programs.py turns
// the PROBE markers into probes; the campaign always adds -fnon-call-exceptions here)
// C++ exceptions thrown from signal handlers: a division by zero (SIGFPE) and a load through
// a null pointer (SIGSEGV) next to probes, the handler throwing through the faulting frame to a
// catch in its caller. The faulting instruction may be one the rewrite moves: the unwinder must
// find its frame and its exception range wherever it ends up.
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sys/sdt.h>

struct Fault {
    int sig;
};

static volatile int64_t g_zero;
static int64_t *volatile g_null;
static int64_t g_seen;

extern "C" void on_fault(int sig)
{
    // Unblock the signal before throwing out of its handler: the frame that would have
    // restored the mask is unwound past.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, nullptr);
    throw Fault{sig};
}

static __attribute__((noinline)) int64_t divide(int64_t a, int64_t i)
{
    /*@PROBE a, i*/
    int64_t q = a / (i % 5 == 2 ? g_zero : i + 1);
    /*@PROBE q, a*/
    return q;
}

static __attribute__((noinline)) int64_t load(int64_t a, int64_t i)
{
    int64_t *p = i % 7 == 4 ? g_null : &g_seen;
    /*@PROBE a, i*/
    int64_t v = *p + a;
    /*@PROBE v*/
    return v;
}

static __attribute__((noinline)) int64_t step(int64_t a, int64_t i)
{
    int64_t r = 0;
    try {
        r = divide(a, i) + load(a, i);
        /*@PROBE r, i*/
    } catch (const Fault &f) {
        g_seen += f.sig;
        /*@PROBE f.sig, g_seen*/
        r = -f.sig;
    }
    return r;
}

int main()
{
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sa.sa_flags = SA_NODEFER;
    sigaction(SIGFPE, &sa, nullptr);
    sigaction(SIGSEGV, &sa, nullptr);
    int64_t s = 1;
    for (int64_t i = 0; i < 300; i++) {
        s = s * 31 + step(s & 0xffff, i);
        /*@PROBE s, i*/
    }
    std::printf("sigthrow %lld %lld\n", (long long)s, (long long)g_seen);
    return 0;
}
