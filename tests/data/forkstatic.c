/* forkstatic.c: a static program that forks (issue 19, item 3): each round the parent and a
 * forked child each hit the probe, the parent waits for the child and prints its status. */
#include <unistd.h>
#define FORK() fork()
#include "forkrounds.h"
