/* sysfork-static.c: a static program that forks through syscall(2) (issue 19): the number is
 * syscall()'s argument, not fixed at its system call instruction: each round the parent and a
 * forked child each hit the probe, the parent waits for the child and prints its status. */
#include <unistd.h>
#include <sys/syscall.h>
volatile long nfork;
#define FORK() ((pid_t)syscall(SYS_fork + nfork))
#include "forkrounds.h"
