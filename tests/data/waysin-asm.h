/* waysin-asm.h: the asm pieces of waysin2.c and waysin3.c (tests/test_analysis_waysin_more.py,
 * test_analysis_waysin_text.py): a probed function, and a function's start and end. */
#include "custom_note.h"

/* a probed function: `mov %rdi,%rax; <probe: nop>; LABEL: add $N,%rax; ret` */
#define PROBED(NAME, LABEL, N)                                                 \
    ".globl " NAME "\n.type " NAME ", @function\n.p2align 4\n"                \
    NAME ":\n.cfi_startproc\n"                                                 \
    "\tmov %rdi, %rax\n"                                                       \
    "990: nop\n"                                                               \
    LABEL ": add $" N ", %rax\n"                                               \
    "\tret\n.cfi_endproc\n.size " NAME ", .-" NAME "\n"                        \
    CN_NOTE("990b", "0", "waysin", NAME, "8@%rax")

#define FUNC(NAME) ".globl " NAME "\n.type " NAME ", @function\n.p2align 4\n" NAME ":\n"
#define END(NAME) ".size " NAME ", .-" NAME "\n"
