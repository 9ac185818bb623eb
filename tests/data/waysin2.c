/* waysin2.c: more ways into probe windows from outside the probed function (issue 19):
 * a 4-byte relative jump table of another function, a landing pad another function's LSDA
 * names, and, in a fixed-address (non-PIE) build, a `mov $imm32`, a `push imm32` and an
 * unaligned data word holding the address of the instruction after a probe. Every *_other
 * function but lpad_other reaches that instruction at run time. */
#include <stdio.h>
#include <stdlib.h>
#include "waysin-asm.h"

asm(".text\n"
    /* plain: no way in from elsewhere: rewritten (a detour) */
    PROBED("plain", ".Lpl_after", "13")
    /* reltab: reached through reltab_other's PIC jump table in .rodata (an entry
       table + int32, the table addressed by a rip-relative lea) */
    PROBED("reltab", ".Lrt_after", "3")
    FUNC("reltab_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n"
    "\tlea .Lrt_table(%rip), %rdx\n\tmovslq (%rdx), %rcx\n\tadd %rdx, %rcx\n"
    "\tjmp *%rcx\n.cfi_endproc\n" END("reltab_other")
    ".pushsection .rodata\n.p2align 2\n"
    ".globl reltab_table\nreltab_table:\n"
    ".Lrt_table: .long .Lrt_after - .Lrt_table\n"
    ".popsection\n"
    /* lpad_other's LSDA names a landing pad inside lpad's window (its call-site row
       covers the call; no exception is thrown at run time) */
    FUNC("lpad_other") ".cfi_startproc\n.cfi_lsda 0x1b, .Llp_lsda\n"
    "\tsub $8, %rsp\n.cfi_adjust_cfa_offset 8\n"
    ".Llp_call: call reltab\n.Llp_call_end:\n"
    "\tadd $8, %rsp\n.cfi_adjust_cfa_offset -8\n\tret\n.cfi_endproc\n" END("lpad_other")
    PROBED("lpad", ".Llp_after", "5")
    ".pushsection .gcc_except_table, \"a\", @progbits\n"
    ".globl lpad_lsda\nlpad_lsda:\n"
    ".Llp_lsda: .byte 0xff, 0xff, 0x03\n"  /* LPStart omitted, no types, udata4 rows */
    ".uleb128 13\n"
    ".long .Llp_call - lpad_other, .Llp_call_end - .Llp_call, .Llp_after - lpad_other\n"
    ".byte 0\n"
    ".popsection\n"
#ifndef __PIE__
    /* immed: its address is a `mov $imm32` of immed_other (fixed-address file) */
    PROBED("immed", ".Lim_after", "7")
    FUNC("immed_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $300, %rax\n\tmov $.Lim_after, %ecx\n\tjmp *%rcx\n"
    ".cfi_endproc\n" END("immed_other")
    /* pushed: a `push imm32; ret` of pushed_other */
    PROBED("pushed", ".Lpu_after", "9")
    FUNC("pushed_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $400, %rax\n\tpush $.Lpu_after\n\tret\n"
    ".cfi_endproc\n" END("pushed_other")
#endif
    /* unaligned: an 8-byte word at an odd address holds the address (a relocation in a
       position-independent file, the absolute word itself otherwise) */
    PROBED("unaligned", ".Lua_after", "11")
    FUNC("unaligned_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $500, %rax\n\tmov unaligned_word(%rip), %rcx\n\tjmp *%rcx\n"
    ".cfi_endproc\n" END("unaligned_other")
    ".pushsection .data, \"aw\", @progbits\n.p2align 3\n"
    ".byte 1, 2, 3\n.globl unaligned_word\nunaligned_word: .quad .Lua_after\n"
    ".popsection\n"
    CN_BASE);

long plain(long), reltab(long), reltab_other(long), lpad(long), lpad_other(long);
long unaligned(long), unaligned_other(long);
#ifndef __PIE__
long immed(long), immed_other(long), pushed(long), pushed_other(long);
#endif

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (long k = 0; k < n; k++) {
        printf("%ld %ld %ld %ld %ld %ld %ld", plain(k), reltab(k), reltab_other(k), lpad(k), lpad_other(k),
               unaligned(k), unaligned_other(k));
#ifndef __PIE__
        printf(" %ld %ld %ld %ld", immed(k), immed_other(k), pushed(k), pushed_other(k));
#endif
        printf("\n");
    }
    return 0;
}
