/* Calls the probe macros of plain.d (header from dtrace -h, with or without semaphores). */
#include "plain.h"

int run_plain(int n) {
  if (PLAIN_ENTER_ENABLED())
    PLAIN_ENTER(n, (char *)"plain");
  PLAIN_LEAVE(n * 2);
  PLAIN_TICK();
  return n;
}
