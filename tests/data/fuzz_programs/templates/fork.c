/* Build: gcc -O2 -o fork fork.c (tools/fuzz_programs.py turns the PROBE markers into probes) */
/* Probes passed before fork, in the child and in the parent; the child's result comes back
   as its exit status. */
#include <stdio.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/sdt.h>

static __attribute__((noinline)) int64_t mix(int64_t x, int n)
{
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005LL + 1442695040888963407LL;
        /*@PROBE x, i*/
    }
    return x;
}

int main(void)
{
    int64_t s = mix(1, 50);
    for (int r = 0; r < 4; r++) {
        /*@PROBE r, s*/
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            int64_t c = mix(s + r, 100);
            /*@PROBE c, r*/
            _exit((int)(c & 0x7f));
        }
        int status = 0;
        waitpid(pid, &status, 0);
        s = mix(s ^ WEXITSTATUS(status), 10);
        /*@PROBE s, status*/
    }
    printf("fork %lld\n", (long long)s);
    return 0;
}
