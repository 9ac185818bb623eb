/* Build: g++ -w -O1 -fcf-protection=full -g -fnon-call-exceptions -static -I/usr/include/csmith -o prog 1-1948.cc, then usdtpatch rewrite (tools/fuzz_programs.py --interesting); pair 1-1948 showed: original exit 0, rewritten signal 6 */
/* fuzz-programs: {"build": "gcc -O1 static -fcf-protection=full -g -fnon-call-exceptions", "want": "signal 6", "traced": false} */
#include <csignal>
#include <cstdint>
#include <sys/sdt.h>
struct Fault {
          ;
      };
        int64_t *volatile g_null;
        int64_t g_seen;
        void on_fault(int sig) {
          throw Fault{
   };
      }
        static __attribute__(()) int64_t divide(int64_t i) {
          ;
      }
        __attribute__(()) int64_t load(int64_t a, int64_t i) {
          int64_t *p = i ? g_null : &g_seen;
          STAP_PROBE1(, , ((a)));
          int64_t v = *p ;
          return v;
      }
        __attribute__(()) int64_t step(int64_t a, int64_t i) {
          int64_t r ;
          try {
            + load(a, i);
        }
      catch (Fault ) {
 }
          return r;
      }
        main() {
          struct sigaction sa;
          sa.sa_handler = on_fault;
          ;
          sigaction(SIGSEGV, &sa, nullptr);
          for (int64_t i ;
      300;
      i++)            step(0xffff, i);
             }
