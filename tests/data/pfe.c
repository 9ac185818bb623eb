/* pfe.c: bytes something names are no padding (issue 46, class 5;
 * tests/test_analysis_padding.py). `probed` ends `nop (the probe); ret`, and what follows
 * it up to the next function is a patchable function entry's NOP sled, as
 * -fpatchable-function-entry=16,14 lays it out: 14 NOPs before `sledded`'s symbol (and FDE),
 * named by the __patchable_function_entries section, 2 after. A tool that patches a sled
 * first checks that it holds NOPs: main does, for every entry. Before, the 14 NOPs were taken
 * for unused padding after `probed`, its forward window ran into them, and the rewrite's jump
 * and int3 filler overwrote the sled ("sled changed"). `lateral` is the same shape with a
 * local NOTYPE label on its padding (a symbol names it); `plain` has real padding after it. */
#include <stdio.h>
#include <stdlib.h>
#include "custom_note.h"

#define NOTE(NAME) CN_NOTE("990b", "0", "pfe", NAME, "8@%rax")

asm(".text\n"
    ".globl plain\n.type plain, @function\n.p2align 4\nplain:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n990: nop\n\tret\n.cfi_endproc\n.size plain, .-plain\n" NOTE("plain")
    ".p2align 4, 0x90\n"
    ".globl probed\n.type probed, @function\nprobed:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n990: nop\n\tret\n.cfi_endproc\n.size probed, .-probed\n" NOTE("probed")
    ".pushsection __patchable_function_entries, \"aw\", @progbits\n.balign 8\n"
    ".quad .Lsled\n.popsection\n"
    ".Lsled: .fill 14, 1, 0x90\n"
    ".globl sledded\n.type sledded, @function\nsledded:\n.cfi_startproc\n"
    "\tnop\n\tnop\n\tlea 1(%rdi), %rax\n\tret\n.cfi_endproc\n.size sledded, .-sledded\n"
    ".p2align 4, 0x90\n"
    ".globl lateral\n.type lateral, @function\nlateral:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n990: nop\n\tret\n.cfi_endproc\n.size lateral, .-lateral\n"
    NOTE("lateral")
    "lateral_pad: .fill 14, 1, 0x90\n"
    ".globl after_lateral\n.type after_lateral, @function\nafter_lateral:\n.cfi_startproc\n"
    "\tlea 2(%rdi), %rax\n\tret\n.cfi_endproc\n.size after_lateral, .-after_lateral\n"
    CN_BASE);

long plain(long), probed(long), sledded(long), lateral(long), after_lateral(long);
extern unsigned char lateral_pad[];
extern unsigned char *__start___patchable_function_entries[];
extern unsigned char *__stop___patchable_function_entries[];

static const char *nops(const unsigned char *p)
{
    for (int i = 0; i < 14; i++)
        if (p[i] != 0x90)
            return "changed";
    return "ok";
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (unsigned char **e = __start___patchable_function_entries;
         e < __stop___patchable_function_entries; e++)
        printf("sled %s\n", nops(*e));
    printf("pad %s\n", nops(lateral_pad));
    for (long k = 0; k < n; k++)
        printf("%ld %ld %ld %ld %ld\n", plain(k), probed(k), sledded(k), lateral(k),
               after_lateral(k));
    return 0;
}
