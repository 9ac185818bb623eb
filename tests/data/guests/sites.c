/* The guest kernels' site forms (tests/guests.py, tests/test_live_guest_*.py): one function
   per form, each holding one site as raw bytes at a global label SITE_site, which is also the
   pc of a USDT note (provider "guest", probe = the form's name; no arguments), so that
   `usdtpatch kcheck` reads the same sites.  Each function is 64-byte aligned: no site crosses a
   page (the kernels optimize a site only within one page).

   `sites FORM N`: prints "ready PID", waits for a line on stdin, runs FORM's site N times,
   prints "done", waits for a line (or EOF) and exits 0.  `sites all N`: runs every site N
   times and exits 0 (for kcheck, which starts the program itself). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOTE(name)                                                                        \
  ".pushsection .note.stapsdt,\"?\",\"note\"\n\t.balign 4\n\t"                            \
  ".4byte 992f-991f, 994f-993f, 3\n991:\t.asciz \"stapsdt\"\n992:\t.balign 4\n993:\t"      \
  ".8byte " #name "_site\n\t.8byte _.stapsdt.base\n\t.8byte 0\n\t"                         \
  ".asciz \"guest\"\n\t.asciz \"" #name "\"\n\t.asciz \"\"\n994:\t.balign 4\n\t"            \
  ".popsection\n\t"                                                                         \
  ".ifndef _.stapsdt.base\n\t"                                                              \
  ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n\t"                \
  ".weak _.stapsdt.base\n\t.hidden _.stapsdt.base\n_.stapsdt.base: .space 1\n\t"           \
  ".size _.stapsdt.base, 1\n\t.popsection\n\t.endif\n"

#define SITE(name, bytes)                                                                 \
  __attribute__((noinline, aligned(64))) void name(void) {                                \
    __asm__ volatile(".globl " #name "_site\n" #name "_site:\n\t.byte " bytes "\n\t"      \
                     NOTE(name));                                                         \
  }

SITE(nop1, "0x90")
SITE(nop5, "0x0f,0x1f,0x44,0x00,0x00")
SITE(combo5, "0x90,0x0f,0x1f,0x44,0x00,0x00")
SITE(combo10, "0x90,0x66,0x2e,0x0f,0x1f,0x84,0x00,0x00,0x00,0x00,0x00")
SITE(nop10, "0x66,0x2e,0x0f,0x1f,0x84,0x00,0x00,0x00,0x00,0x00")

static const struct { const char *name; void (*fn)(void); } FORMS[] = {
  {"nop1", nop1}, {"nop5", nop5}, {"combo5", combo5}, {"combo10", combo10}, {"nop10", nop10},
};
#define NFORMS (sizeof FORMS / sizeof FORMS[0])

int main(int argc, char **argv) {
  char line[64];
  long n;
  size_t i;
  if (argc != 3) return 2;
  n = atol(argv[2]);
  if (strcmp(argv[1], "all") == 0) {
    for (i = 0; i < NFORMS; i++)
      for (long k = 0; k < n; k++) FORMS[i].fn();
    return 0;
  }
  for (i = 0; i < NFORMS && strcmp(FORMS[i].name, argv[1]) != 0; i++) {}
  if (i == NFORMS) return 2;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin)) return 1;
  for (long k = 0; k < n; k++) FORMS[i].fn();
  printf("done\n");
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin)) return 0;
  return 0;
}
