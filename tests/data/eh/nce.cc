// nce.cc: a fault inside a detour, in code built with -fnon-call-exceptions (issue 30,
// class 2): reader()'s window holds the load `*p`; when p is null the SIGSEGV handler
// throws (the unwinder looks the faulting pc up as it is, through the signal frame) and
// reader's catch returns -1. With "backtrace" the handler instead counts the frames
// backtrace() finds from the fault (unwinding through the detour's FDE) and leaves with
// siglongjmp.
// Build: g++ -O2 -fnon-call-exceptions -o nce nce.cc (also -O0 to -O3, -no-pie, clang++,
// -static; -DEH_LIB -shared -fPIC for libnce.so and -DEH_DRIVER for its driver)
#include <sys/sdt.h>
#include <csetjmp>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <execinfo.h>
struct Fault {};
extern "C" long reader(long *p, long k);
#ifndef EH_DRIVER
volatile long sink;
extern "C" __attribute__((noinline)) long reader(long *p, long k) {
  long r;
  try {
    sink = k;
    DTRACE_PROBE1(eh, nce, k);
    r = *p + k;
  } catch (const Fault &) {
    r = -1;
  }
  return r;
}
#endif
#ifndef EH_LIB
static bool tracing_back;
static sigjmp_buf back;
static void on_segv(int) {
  if (!tracing_back) throw Fault();
  void *frames[64];
  int n = backtrace(frames, 64);
  printf("backtrace: %d frames\n", n);  // the original's count: through reader to main
  siglongjmp(back, 1);
}
int main(int argc, char **argv) {
  tracing_back = argc > 1 && strcmp(argv[1], "backtrace") == 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_segv;
  sa.sa_flags = SA_NODEFER;
  sigaction(SIGSEGV, &sa, nullptr);
  long v = 5, t = 0;
  for (long k = 0; k < 4; k++) {
    long r = -2;
    if (!tracing_back || sigsetjmp(back, 1) == 0) r = reader(k == 2 ? nullptr : &v, k);
    printf("%ld %ld\n", k, r);
    t += r;
  }
  printf("total %ld\n", t);
  return 0;
}
#endif
