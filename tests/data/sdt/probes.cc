// SDT fixture (C++11 and later): probes in templates and inline functions (COMDAT groups),
// class members, references, enum classes, bool, char/wchar_t, cv-qualified values and
// lambdas.  Built with systemtap's <sys/sdt.h> and with usdtpatch's.
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <cstddef>
#include <cstdint>

// With _SDT_HAS_SEMAPHORES every probe of the file names a semaphore.
#define SEMA(n) unsigned short cxx_##n##_semaphore __attribute__((section(".probes")))
extern "C" {
SEMA(tmpl); SEMA(inl); SEMA(method); SEMA(self); SEMA(cv); SEMA(wide); SEMA(enums);
SEMA(nulls); SEMA(refs); SEMA(sema); SEMA(lambda); SEMA(twelve);
}

enum class mode : short { off = -1, on = 1 };
enum plain_enum { PA, PB };

template <typename T>
T tmpl(T a, T b) {
  STAP_PROBE2(cxx, tmpl, a, b);
  return a > b ? a : b;
}

inline int inl(const int &r, long v) {
  STAP_PROBE2(cxx, inl, r, v);
  return r + static_cast<int>(v);
}

struct widget {
  int id;
  double weight;
  const char *name;
  long counts[4];
  int method(int k) const {
    STAP_PROBE4(cxx, method, id, weight, name, counts[k & 3]);
    STAP_PROBE1(cxx, self, this);
    return id + k;
  }
};

int kinds(int n, widget &w) {
  const int cn = n;
  const volatile long cvl = n * 2L;
  bool flag = n > 1;
  char c = static_cast<char>('a' + n);
  signed char sc = static_cast<signed char>(-n);
  wchar_t wc = L'w';
  char16_t c16 = u'x';
  char32_t c32 = U'y';
  std::int64_t i64 = -static_cast<std::int64_t>(n) << 40;
  std::uint8_t u8 = static_cast<std::uint8_t>(n);
  mode m = n > 0 ? mode::on : mode::off;
  STAP_PROBE6(cxx, cv, cn, cvl, flag, c, sc, wc);
  STAP_PROBE5(cxx, wide, c16, c32, i64, u8, m);
  STAP_PROBE3(cxx, enums, PB, m, static_cast<plain_enum>(n & 1));
  STAP_PROBE2(cxx, nulls, nullptr, static_cast<void *>(nullptr));
  STAP_PROBE3(cxx, refs, w.id, w.counts[n & 3], &w);
  if (cxx_sema_semaphore)
    STAP_PROBE1(cxx, sema, n);
  auto lam = [&](int x) {
    STAP_PROBE3(cxx, lambda, x, n, w.weight);
    return x * n;
  };
  STAP_PROBE12(cxx, twelve, n, cn, cvl, flag, c, sc, wc, i64, u8, w.weight, &w, lam(n));
  return lam(n + 1) + w.method(n) + inl(cn, cvl) + tmpl(n, cn) + static_cast<int>(tmpl(1.5, 2.5));
}

#ifndef SDT_FIXTURE_LIB
int main(int argc, char **) {
  widget w{argc, 1.25, "w", {1, 2, 3, 4}};
  return kinds(argc, w) == 12345;
}
#endif
