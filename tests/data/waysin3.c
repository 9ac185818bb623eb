/* waysin3.c: 4-byte relative jump tables placed in .text (issue 19, item 1): the instruction
 * after a probe is an entry of another function's PIC table that lies in code, and a code
 * word that would read as such an entry but is an instruction's immediate. */
#include <stdio.h>
#include <stdlib.h>
#include "waysin-asm.h"

asm(".text\n"
    /* plain: no way in from elsewhere: rewritten (a detour) */
    PROBED("plain", ".Lpl_after", "13")
    /* intab: reached through intab_other's PIC jump table, which lies in .text inside
       intab_other itself (after its indirect jump, in its FDE's range) */
    PROBED("intab", ".Lit_after", "3")
    FUNC("intab_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n"
    "\tlea .Lit_table(%rip), %rdx\n\tmovslq 4(%rdx), %rcx\n\tadd %rdx, %rcx\n"
    "\tjmp *%rcx\n.p2align 2\n"
    ".globl intab_table\nintab_table:\n"
    ".Lit_table: .long 0, .Lit_after - .Lit_table\n"
    ".cfi_endproc\n" END("intab_other")
    /* gaptab: the table lies in .text between two functions, in no function's range */
    PROBED("gaptab", ".Lgt_after", "5")
    FUNC("gaptab_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $200, %rax\n"
    "\tlea .Lgt_table(%rip), %rdx\n\tmovslq (%rdx), %rcx\n\tadd %rdx, %rcx\n"
    "\tjmp *%rcx\n.cfi_endproc\n" END("gaptab_other")
    ".p2align 2\n.globl gaptab_table\ngaptab_table:\n"
    ".Lgt_table: .long .Lgt_after - .Lgt_table\n"
    /* codeword: codeword_other's address is taken by a rip-relative lea, and the
       immediate of its `mov $imm32` (4 bytes on) would land after the probe as the entry of
       a table there; decoding codeword_other from its entry shows the bytes are an
       instruction: no way in, rewritten */
    PROBED("codeword", ".Lcw_after", "7")
    FUNC("codeword_other") ".cfi_startproc\n"
    ".Lcw_base: nopl (%rax)\n\tmov $(.Lcw_after - .Lcw_base), %ecx\n"
    "\tlea .Lcw_base(%rip), %rax\n\tsub %rdi, %rax\n\tret\n"
    ".cfi_endproc\n" END("codeword_other")
    CN_BASE);

long plain(long), intab(long), intab_other(long), gaptab(long), gaptab_other(long);
long codeword(long);

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (long k = 0; k < n; k++)
        printf("%ld %ld %ld %ld %ld %ld\n", plain(k), intab(k), intab_other(k), gaptab(k),
               gaptab_other(k), codeword(k));
    return 0;
}
