/* xbegin.c: `xbegin`'s fallback address is a branch target (issue 46, class 3;
 * tests/test_analysis_relative.py). The instruction after each probe is the fallback of an
 * xbegin: of another function's `xbegin rel32` (xfar), of the next function's
 * `xbegin rel16` (xnear: data16, 66 c7 f8), of the probed function's own xbegin after the
 * probe (xown); xback's own xbegin before the probe falls back to the instruction after it
 * (a window may end there, and move the xbegin); xin's xbegin follows its probe (every window
 * holds it). No window that moves an xbegin is used: no verifier models its fallback.
 * `plain` has none. The xbegin functions run only where the CPU has RTM
 * (elsewhere xbegin and xtest raise #UD); a transaction begun is ended (xtest; xend); an
 * abort lands outside one (a plain ret). */
#include <stdio.h>
#include <stdlib.h>
#include <cpuid.h>
#include "custom_note.h"

#define END_TX "\txtest\n\tjz 1f\n\txend\n1:\tret\n"
#define PROBED(NAME, PRE, LABEL, N, END)                                        \
    ".globl " NAME "\n.type " NAME ", @function\n.p2align 4\n"                \
    NAME ":\n.cfi_startproc\n" PRE                                             \
    "\tmov %rdi, %rax\n"                                                       \
    "990: nop\n"                                                               \
    LABEL ": add $" N ", %rax\n"                                               \
    END ".cfi_endproc\n.size " NAME ", .-" NAME "\n"                           \
    CN_NOTE("990b", "0", "xbegin", NAME, "8@%rax")
#define OTHER(NAME, XBEGIN, N)                                                 \
    ".globl " NAME "\n.type " NAME ", @function\n.p2align 4\n"                \
    NAME ":\n.cfi_startproc\n"                                                 \
    "\tmov %rdi, %rax\n\tadd $" N ", %rax\n" XBEGIN END_TX                     \
    ".cfi_endproc\n.size " NAME ", .-" NAME "\n"

asm(".text\n"
    PROBED("plain", "", ".Lpl_after", "1", "\tret\n")
    PROBED("xfar", "", ".Lxf_after", "3", "\tret\n")
    ".skip 4096, 0xcc\n"
    OTHER("xfar_other", "\txbegin .Lxf_after\n", "100")
    PROBED("xnear", "", ".Lxn_after", "5", "\tret\n")
    OTHER("xnear_other", "\t.byte 0x66, 0xc7, 0xf8\n\t.word .Lxn_after - 2f\n2:\n", "200")
    PROBED("xown", "", ".Lxo_after", "7", "\txbegin .Lxo_after\n" END_TX)
    PROBED("xback", "\txbegin .Lxb_after\n", ".Lxb_after", "9", END_TX)
    /* xin: an xbegin right after the probe, its fallback far: every window holds it */
    ".globl xin\n.type xin, @function\n.p2align 4\nxin:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n990: nop\n\txbegin 3f\n\tadd $11, %rax\n\txend\n\tret\n"
    "3:\tadd $11, %rax\n\tret\n.cfi_endproc\n.size xin, .-xin\n"
    CN_NOTE("990b", "0", "xbegin", "xin", "8@%rax")
    CN_BASE);

long plain(long), xfar(long), xfar_other(long), xnear(long), xnear_other(long), xown(long);
long xback(long), xin(long);

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    unsigned a, b = 0, c, d;
    int rtm = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 11 & 1);  /* CPUID.7.EBX.RTM */
    for (long k = 0; k < n; k++) {
        printf("%ld %ld %ld", plain(k), xfar(k), xnear(k));
        if (rtm)
            printf(" %ld %ld %ld %ld %ld", xfar_other(k), xnear_other(k), xown(k), xback(k),
                   xin(k));
        printf("\n");
    }
    return 0;
}
