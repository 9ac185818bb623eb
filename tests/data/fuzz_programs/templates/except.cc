// Build: g++ -O2 -o except except.cc (tools/fuzz_programs.py turns the PROBE markers into probes)
// C++ exceptions thrown through frames with probes, caught, rethrown; built also with
// -fnon-call-exceptions by the campaign.
#include <cstdio>
#include <cstdint>
#include <stdexcept>
#include <sys/sdt.h>

static int64_t g_caught;

struct Guard {
    int64_t *where;
    int64_t add;
    ~Guard() { *where += add; }
};

static __attribute__((noinline)) int64_t leaf(int64_t x)
{
    /*@PROBE x, g_caught*/
    if (x % 7 == 3)
        throw std::runtime_error("seven");
    if (x % 11 == 5)
        throw static_cast<int>(x);
    return x * 2;
}

static __attribute__((noinline)) int64_t middle(int64_t x)
{
    int64_t local = 0;
    Guard g{&local, x};
    int64_t r = leaf(x + 1);
    /*@PROBE r, x*/
    return r + local;
}

static __attribute__((noinline)) int64_t outer(int64_t x)
{
    try {
        int64_t r = middle(x);
        /*@PROBE r*/
        return r;
    } catch (const std::runtime_error &) {
        g_caught += 1;
        /*@PROBE x, g_caught*/
        return -1;
    } catch (int v) {
        g_caught += 100;
        /*@PROBE v*/
        if (v % 2)
            throw;
        return v;
    }
}

int main()
{
    int64_t s = 0;
    for (int64_t i = 0; i < 200; i++) {
        try {
            s += outer(i);
        } catch (int v) {
            s -= v;
            /*@PROBE i, v, s*/
        }
    }
    std::printf("except %lld %lld\n", (long long)s, (long long)g_caught);
    return 0;
}
