/* coderead.c: code read as data (issue 46, class 6; tests/test_analysis_coderead.py).
 * detector compares the first byte of the instruction after hooked's probe with its
 * original (0x48, add's REX prefix), as a hook detector does; checksum adds up the 8 bytes
 * at summed's probe. A rewrite changes both: check says so (code-read-as-data), naming the
 * instruction that reads and the address. `plain`'s bytes nothing reads. */
#include <stdio.h>
#include <stdlib.h>
#include "custom_note.h"

#define PROBED(NAME, LABEL, N)                                                 \
    ".globl " NAME "\n.type " NAME ", @function\n.p2align 4\n"                \
    NAME ":\n.cfi_startproc\n\tmov %rdi, %rax\n990: nop\n"                     \
    LABEL ": add $" N ", %rax\n\tret\n.cfi_endproc\n.size " NAME ", .-" NAME "\n" \
    CN_NOTE("990b", "0", "coderead", NAME, "8@%rax")

asm(".text\n"
    PROBED("plain", ".Lpl_after", "1")
    PROBED("hooked", ".Lhk_after", "3")
    PROBED("summed", ".Lsu_after", "5")
    ".globl detector\n.type detector, @function\n.p2align 4\ndetector:\n.cfi_startproc\n"
    "\txor %eax, %eax\n\tcmpb $0x48, .Lhk_after(%rip)\n\tsete %al\n\tret\n"
    ".cfi_endproc\n.size detector, .-detector\n"
    ".globl checksum\n.type checksum, @function\n.p2align 4\nchecksum:\n.cfi_startproc\n"
    "\tmov summed(%rip), %rax\n\tret\n.cfi_endproc\n.size checksum, .-checksum\n"
    CN_BASE);

long plain(long), hooked(long), summed(long), detector(void);
unsigned long checksum(void);

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (long k = 0; k < n; k++)
        printf("%ld %ld %ld\n", plain(k), hooked(k), summed(k));
    printf("detector %ld checksum %lx\n", detector(), checksum());
    return 0;
}
