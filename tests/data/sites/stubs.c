/* stubs.c: 8-bit jumps into a window whose stub lies inside the function (issue 36), for
 * tests/test_rewrite_inner_stubs.py. Build: gcc -O2 -g0 -I fixtures/src -I tests/data
 * stubs.c -o stubs (or clang). Each function is long enough (FILL) that no alignment padding
 * around it is in an 8-bit jump's reach.
 * - fillerstub: python3.11d's gc__start: `nop; jmp back` out of line, the instruction after it
 *   the target of a `jle` rel8: the stub goes into the window's own int3 filler;
 * - deadstub: OpenJDK 25's NewWeakGlobalRef__return: the instruction after the probe is the
 *   target of a `jmp` rel8 followed by a 10-byte NOP no one runs: the stub goes there, not
 *   into the NOP run that is run (fall-through) nor the one a jump lands on;
 * - packed: `nop; ret` between two functions, no NOP in an 8-bit jump's reach: stays
 *   window-function-end (tests/test_rewrite_short_window.py);
 * - rows: a push and a pop (for the unwind-row test). */
#include <stdio.h>
#include <stdlib.h>
#include "waysin-asm.h"

#define FILL ".rept 50\n\tadd $1, %rax\n.endr\n" /* 200 bytes of code that runs */
#define RUN10 ".rept 10\n\tadd %rdi, %rax\n.endr\n" /* no window before the probe reaches
                                                            the branch into it */
#define NOP10 "\t.byte 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0\n"
/* an address the test looks up, recorded in a section that is not loaded: a symbol there
   would name the bytes (a way in, issue 46), and no NOP run it names is unused */
#define MARK(NAME) ".pushsection .test_marks, \"\", @progbits\n.asciz \"" NAME "\"\n" \
    ".quad .Lmark_" NAME "\n.popsection\n.Lmark_" NAME ":\n"

asm(".text\n"
    FUNC("fillerstub") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n" FILL
    "\ttest $1, %rdi\n\tjne .Lfs_probe\n"
    ".Lfs_back:\n\tcmp $1, %rdi\n\tjle .Lfs_next\n"
    "\tadd $5, %rax\n" RUN10 "\tret\n"
    ".Lfs_probe:\n990: nop\n\tjmp .Lfs_back\n"
    ".Lfs_next:\n\tlea 1(%rax), %rax\n\tadd %rdi, %rax\n\tadd %rdi, %rax\n\tadd %rdi, %rax\n"
    FILL "\tret\n.cfi_endproc\n" END("fillerstub")
    CN_NOTE("990b", "0", "sites", "fillerstub", "8@%rax")

    FUNC("deadstub") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n" FILL
    "\tcmp $100, %rdi\n\tja .Lds_jumped\n"
    MARK("deadstub_run") NOP10 /* run: fall-through */
    "\tadd $2, %rax\n\tjmp .Lds_test\n"
    MARK("deadstub_jumped")
    ".Lds_jumped:\n" NOP10 /* not reached by falling through, but a jump lands on it */
    "\tadd $4, %rax\n"
    ".Lds_test:\n\ttest $1, %rdi\n\tjne .Lds_probe\n" RUN10
    "\tadd $7, %rax\n\tjmp .Lds_after\n"
    MARK("deadstub_dead") NOP10 /* after a jmp, no one runs it */
    ".Lds_probe:\n990: nop\n"
    ".Lds_after:\n\tcmp $5, %rdi\n\tje .Lds_five\n" FILL "\tret\n"
    ".Lds_five:\n\tneg %rax\n\tret\n"
    ".cfi_endproc\n" END("deadstub")
    CN_NOTE("990b", "0", "sites", "deadstub", "8@%rax")

    /* packed: a probe-only function between two functions with no NOP within 128 bytes
       (window-function-end, and no short window: no place for its entry stub) */
    FUNC("packed_a") ".cfi_startproc\n\tmov %rdi, %rax\n" FILL "\tret\n.cfi_endproc\n"
    END("packed_a")
    ".globl packed\n.type packed, @function\npacked:\n.cfi_startproc\n"
    "990: nop\n\tret\n.cfi_endproc\n" END("packed")
    CN_NOTE("990b", "0", "sites", "packed", "")
    ".globl packed_c\n.type packed_c, @function\npacked_c:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n" FILL "\tret\n.cfi_endproc\n" END("packed_c")

    FUNC("rows") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n"
    ".globl rows_pushed\n\tpush %rbx\n.cfi_adjust_cfa_offset 8\nrows_pushed:\n"
    "\tadd $1, %rax\n"
    ".globl rows_popped\n\tpop %rbx\n.cfi_adjust_cfa_offset -8\nrows_popped:\n"
    "\tret\n.cfi_endproc\n" END("rows")
    CN_BASE);

long fillerstub(long), deadstub(long), rows(long), packed_a(long), packed_c(long);
void packed(void);

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 3;
    for (long i = 0; i < n + 5; i++)
        printf("%ld %ld %ld\n", fillerstub(i), deadstub(i), deadstub(i + 200));
    printf("%ld\n", rows(n));
    for (long i = 0; i < n; i++)
        packed();
    printf("%ld %ld\n", packed_a(n), packed_c(n));
    return 0;
}
