// SDT fixture for C++98 and C++03 (valid in every later standard too): probes in templates
// and inline functions (COMDAT groups), class members, references, cv-qualified values,
// bool, char and wchar_t, semaphores, 12 arguments, and an argument that fits no register.
// Built with systemtap's <sys/sdt.h> and with usdtpatch's (tests/test_sdt_notes.py).
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <cstddef>

#define SEMA(n) unsigned short cxx98_##n##_semaphore __attribute__((section(".probes")))
extern "C" {
SEMA(tmpl); SEMA(inl); SEMA(method); SEMA(cv); SEMA(twelve); SEMA(big);
}

enum plain_enum { PA, PB };

template <typename T>
T tmpl(T a, T b) {
  STAP_PROBE2(cxx98, tmpl, a, b);
  return a > b ? a : b;
}

inline int inl(const int &r, long v) {
  STAP_PROBE2(cxx98, inl, r, v);
  return r + static_cast<int>(v);
}

struct pair16 { long a, b; };

struct widget {
  int id;
  double weight;
  const char *name;
  long counts[4];
  int method(int k) const {
    STAP_PROBE4(cxx98, method, id, weight, name, counts[k & 3]);
    return id + k;
  }
};

int kinds(int n, widget &w) {
  const int cn = n;
  const volatile long cvl = n * 2L;
  bool flag = n > 1;
  char c = static_cast<char>('a' + n);
  wchar_t wc = L'w';
  plain_enum e = static_cast<plain_enum>(n & 1);
  pair16 big = { n, 2L * n };
  STAP_PROBE6(cxx98, cv, cn, cvl, flag, c, wc, e);
  if (cxx98_twelve_semaphore)
    STAP_PROBE12(cxx98, twelve, n, cn, cvl, flag, c, wc, e, w.weight, &w, w.id, n + 1, PB);
#ifndef SDT_NO_BIG_ARG  // g++ warns "unsupported size for integer register", either header
  STAP_PROBE2(cxx98, big, n, big);
#endif
  return w.method(n) + inl(cn, cvl) + tmpl(n, cn) + static_cast<int>(tmpl(1.5, 2.5))
         + static_cast<int>(big.b);
}

#ifndef SDT_FIXTURE_LIB
int main(int argc, char **) {
  widget w = { argc, 1.25, "w", { 1, 2, 3, 4 } };
  return kinds(argc, w) == 12345;
}
#endif
