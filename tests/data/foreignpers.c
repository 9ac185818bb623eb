/* foreignpers.c: an LSDA that is not GCC's (issue 46, class 4;
 * tests/test_analysis_personality.py). `foreign`'s CIE names my_personality, whose LSDA
 * format is its own: four bytes that read as an empty GCC table, then the landing pad's
 * offset from the function's start. `foreign` calls raise_it, which raises an exception;
 * my_personality lands it on .Lpad, the instruction right after the probe, with %rax = 41.
 * Read as GCC's, that LSDA names no landing pad: before, the window over the probe moved
 * .Lpad into a detour and the landing went into the middle of the new jump. `plain` is a
 * site in a function without a personality. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unwind.h>
#include "custom_note.h"

asm(".text\n"
    ".globl plain\n.type plain, @function\n.p2align 4\nplain:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n990: nop\n\tadd $1, %rax\n\tret\n.cfi_endproc\n.size plain, .-plain\n"
    CN_NOTE("990b", "0", "foreignpers", "plain", "8@%rax")
    ".globl foreign\n.type foreign, @function\n.p2align 4\nforeign:\n.cfi_startproc\n"
    ".cfi_personality 0x9b, .Lpers_slot\n.cfi_lsda 0x1b, .Lcustom_lsda\n"
    "\tsub $8, %rsp\n.cfi_adjust_cfa_offset 8\n"
    "\tcall raise_it\n"
    "\tmov %rdi, %rax\n"
    "990: nop\n"
    ".Lpad: add $1, %rax\n"
    "\tadd $8, %rsp\n.cfi_adjust_cfa_offset -8\n\tret\n"
    ".cfi_endproc\n.size foreign, .-foreign\n"
    CN_NOTE("990b", "0", "foreignpers", "foreign", "8@%rax")
    ".pushsection .data.rel.ro, \"aw\", @progbits\n.balign 8\n"
    ".Lpers_slot: .quad my_personality\n.popsection\n"
    ".pushsection .gcc_except_table, \"a\", @progbits\n"
    ".Lcustom_lsda: .byte 0xff, 0xff, 0x01, 0x00\n"  /* as GCC's: no LPStart, no types, */
    ".long .Lpad - foreign\n"                          /* no call sites; then our offset */
    ".popsection\n"
    CN_BASE);

long plain(long), foreign(long);

_Unwind_Reason_Code my_personality(int version, _Unwind_Action actions,
                                   _Unwind_Exception_Class cls, struct _Unwind_Exception *ue,
                                   struct _Unwind_Context *ctx);

_Unwind_Reason_Code my_personality(int version, _Unwind_Action actions,
                                   _Unwind_Exception_Class cls, struct _Unwind_Exception *ue,
                                   struct _Unwind_Context *ctx)
{
    const unsigned char *lsda = _Unwind_GetLanguageSpecificData(ctx);
    uint32_t off;
    (void)version, (void)cls, (void)ue;
    if (actions & _UA_SEARCH_PHASE)
        return _URC_HANDLER_FOUND;
    memcpy(&off, lsda + 4, 4);
    _Unwind_SetGR(ctx, __builtin_eh_return_data_regno(0), 41);
    _Unwind_SetIP(ctx, _Unwind_GetRegionStart(ctx) + off);
    return _URC_INSTALL_CONTEXT;
}

static void cleanup(_Unwind_Reason_Code code, struct _Unwind_Exception *e)
{
    (void)code, (void)e;
}

void raise_it(void);

void raise_it(void)
{
    static struct _Unwind_Exception ue;
    ue.exception_class = 0x5553445450415443ULL;
    ue.exception_cleanup = cleanup;
    _Unwind_RaiseException(&ue);
    abort();  /* no handler */
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (long k = 0; k < n; k++)
        printf("%ld %ld\n", plain(k), foreign(k));
    return 0;
}
