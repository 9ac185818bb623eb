/* cxx-trywin.cc: probes next to calls in try regions (issue 19, item 4): t1's window holds a
 * call whose landing pad the function's LSDA names, in a call-site entry that starts before
 * the window (moved with the detour's own LSDA, by default and with --calls move), t3's a
 * call it moves with the detour's own LSDA. k = 42 throws through each. */
#include <sys/sdt.h>
#include <stdexcept>
#include <cstdio>
#include <cstdlib>
volatile int sink;
__attribute__((noinline)) void may_throw(int x) { if (x == 42) throw std::runtime_error("x"); sink = x; }
__attribute__((noinline)) int g1(int x) {
  try { may_throw(x); DTRACE_PROBE(cxx, t1); may_throw(x + 1); } catch (...) { return -1; }
  return 1;
}
__attribute__((noinline)) int g2(int x) {
  try { may_throw(x); DTRACE_PROBE(cxx, t2); } catch (...) { return -2; }
  return 2;
}
__attribute__((noinline)) int g3(int x) {
  may_throw(x + 100);
  try { DTRACE_PROBE(cxx, t3); may_throw(x); } catch (...) { return -3; }
  return 3;
}
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  for (int k = 40; k < 40 + n; k++) printf("%d %d %d\n", g1(k), g2(k), g3(k));
  return 0;
}
