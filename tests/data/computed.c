/* computed.c: computed jumps into a probed function from another one (issue 30, class 4):
 * each `NAME_other` jumps to the instruction after NAME's probe through a way the file-wide
 * ways-in scans did not model. Build: gcc -O2 -fPIE -pie -g0 -I fixtures/src -I tests/data
 * -o computed tests/data/computed.c (also clang, and -fno-pie -no-pie). */
#include <stdio.h>
#include <stdlib.h>
#include "waysin-asm.h"

/* a bounded PIC dispatch of entry 1 (the index in %rsi, `cmp $1; ja` its bounds check):
   TABLE_REG holds the table, BASE_REG the base its entries are relative to */
#define DISPATCH(N, SETUP)                                                     \
    "\tmov %rdi, %rax\n\tadd $100, %rax\n\tmov $" N ", %esi\n"                \
    "\tcmp $" N ", %rsi\n\tja 1f\n" SETUP                                      \
    "\tmovslq (%rdx,%rsi,4), %rcx\n\tadd %r8, %rcx\n\tjmp *%rcx\n1: ret\n"

asm(".text\n"
    /* plain: no way in from elsewhere: rewritten (a detour) */
    PROBED("plain", ".Lpl_after", "13")
    /* fnbase: a table in .rodata whose entries are relative to the function's symbol */
    PROBED("fnbase", ".Lfb_after", "3")
    FUNC("fnbase_other") ".cfi_startproc\n"
    DISPATCH("1", "\tlea .Lfb_table(%rip), %rdx\n\tlea fnbase(%rip), %r8\n")
    ".cfi_endproc\n" END("fnbase_other")
    /* arith: the table's base is built by arithmetic (lea T-64; add $64) */
    PROBED("arith", ".Lar_after", "5")
    FUNC("arith_other") ".cfi_startproc\n"
    DISPATCH("1", "\tlea .Lar_table-64(%rip), %rdx\n\tadd $64, %rdx\n\tmov %rdx, %r8\n")
    ".cfi_endproc\n" END("arith_other")
    /* far: the entry is 4200 entries (16.4 KiB) after its table's base */
    PROBED("far", ".Lfa_after", "7")
    FUNC("far_other") ".cfi_startproc\n"
    DISPATCH("4200", "\tlea .Lfa_table(%rip), %rdx\n\tmov %rdx, %r8\n")
    ".cfi_endproc\n" END("far_other")
    /* cut: another function takes the address of the table's entry 1 (cut_peek), which
       the scan took for the start of another table */
    PROBED("cut", ".Lcu_after", "9")
    FUNC("cut_other") ".cfi_startproc\n"
    DISPATCH("2", "\tlea .Lcu_table(%rip), %rdx\n\tmov %rdx, %r8\n")
    ".cfi_endproc\n" END("cut_other")
    FUNC("cut_peek") ".cfi_startproc\n"
    "\tlea .Lcu_table+4(%rip), %rax\n\tmovslq (%rax), %rax\n\tret\n"
    ".cfi_endproc\n" END("cut_peek")
    /* leaadd: `lea leaadd(%rip)` plus the offset of the instruction after the probe */
    PROBED("leaadd", ".Lla_after", "11")
    FUNC("leaadd_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n\tlea leaadd(%rip), %rcx\n"
    "\tadd $(.Lla_after - leaadd), %rcx\n\tjmp *%rcx\n"
    ".cfi_endproc\n" END("leaadd_other")
    /* unbound: a table without a bounds check (the index is set, not checked): its
       entries are read while they point at code, and the functions they land in are
       all-targets */
    PROBED("unbound", ".Lub_after", "15")
    FUNC("unbound_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n\tmov $1, %esi\n"
    "\tlea .Lub_table(%rip), %rdx\n\tmovslq (%rdx,%rsi,4), %rcx\n\tadd %rdx, %rcx\n"
    "\tjmp *%rcx\n.cfi_endproc\n" END("unbound_other")
    /* leaplain: its address is taken and stored as it is (no arithmetic): rewritten */
    PROBED("leaplain", ".Llp_after", "17")
    FUNC("leaplain_other") ".cfi_startproc\n"
    "\tlea leaplain(%rip), %rcx\n\tmov %rcx, leaplain_slot(%rip)\n\tmov %rdi, %rax\n"
    "\tret\n.cfi_endproc\n" END("leaplain_other")
    /* otherreg: the bounds check is on another register than the index: no bounds, so
       the function the entries land in is all-targets (not a bounded table's way in) */
    PROBED("otherreg", ".Lor_after", "19")
    FUNC("otherreg_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n\tmov $1, %esi\n\tmov $1, %edi\n"
    "\tcmp $1, %rdi\n\tja 1f\n\tlea .Lor_table(%rip), %rdx\n"
    "\tmovslq (%rdx,%rsi,4), %rcx\n\tadd %rdx, %rcx\n\tjmp *%rcx\n1: ret\n"
    ".cfi_endproc\n" END("otherreg_other")
    /* taken: the bounds check is a `jbe` taken to the table's block (PostgreSQL's
       switches): bounded, its entry is a way in (before, the straight line before the block
       was searched, no check found, and the functions its entries land in poisoned) */
    PROBED("taken", ".Ltk_after", "21")
    FUNC("taken_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n\tmov $1, %esi\n\tcmp $1, %rsi\n\tjbe 2f\n"
    "\tret\n\t.p2align 4\n2:\tlea .Ltk_table(%rip), %rdx\n"
    "\tmovslq (%rdx,%rsi,4), %rcx\n\tadd %rdx, %rcx\n\tjmp *%rcx\n"
    ".cfi_endproc\n" END("taken_other")
    /* fellbe: a `jbe` fallen through into the table: the index is out of the compared range
       there, which bounds nothing: poisoned (before, taken for a bound of 1 entry) */
    PROBED("fellbe", ".Lfl_after", "23")
    FUNC("fellbe_other") ".cfi_startproc\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n\tmov $1, %esi\n\tcmp $0, %rsi\n\tjbe 1f\n"
    "\tlea .Lfl_table(%rip), %rdx\n\tmovslq (%rdx,%rsi,4), %rcx\n\tadd %rdx, %rcx\n"
    "\tjmp *%rcx\n1: ret\n.cfi_endproc\n" END("fellbe_other")
    /* padjmp (libruby's shape): arithmetic feeds a register on the path that ends in a jump
       through a loaded pointer; the alignment NOP after it is reached by no one, and the
       jump after the NOP goes to the argument it was passed (a tail call). Before, the NOP
       was taken as reached by the jumps before it: the argument looked computed from an
       unknown base and every function of the file was poisoned. Never called. */
    FUNC("padjmp_other") ".cfi_startproc\n"
    "\ttest %esi, %esi\n\tje 2f\n\tlea 16(%rdi,%rsi,8), %rdx\n"
    "\tmov leaplain_slot(%rip), %rax\n\tjmp *%rax\n\tnop\n2:\tjmp *%rdx\n"
    ".cfi_endproc\n" END("padjmp_other")
    /* distance: another function takes distance's address less a register (a reach
       check): a distance, not an address (assumption code-differences): not poisoned */
    PROBED("distance", ".Ldi_after", "25")
    FUNC("distance_other") ".cfi_startproc\n"
    "\tlea distance(%rip), %rcx\n\tsub %rdi, %rcx\n\tmov %rcx, distance_slot(%rip)\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n\tret\n.cfi_endproc\n" END("distance_other")
    /* subconst: the address less a register set to a constant just before: an address
       (a constant offset back), stored: poisoned, unlike distance */
    PROBED("subconst", ".Lsc_after", "27")
    FUNC("subconst_other") ".cfi_startproc\n"
    "\tlea subconst(%rip), %rcx\n\tmov $-4, %rdx\n\tsub %rdx, %rcx\n"
    "\tmov %rcx, distance_slot(%rip)\n"
    "\tmov %rdi, %rax\n\tadd $100, %rax\n\tret\n.cfi_endproc\n" END("subconst_other")
    CN_BASE
    ".section .rodata\n.p2align 2\n"
    /* each table's entry that lands after a probe has a symbol (NAME_entry) */
    ".Lfb_table: .long 0\nfnbase_entry: .long .Lfb_after - fnbase\n"
    ".Lar_table: .long 0\narith_entry: .long .Lar_after - .Lar_table\n"
    ".Lcu_table: .long 0, 0\ncut_entry: .long .Lcu_after - .Lcu_table\n"
    ".Lub_table: .long .Lub_after - .Lub_table\n"
    "unbound_entry: .long .Lub_after - .Lub_table\n"
    ".Lor_table: .long .Lor_after - .Lor_table\n"
    "otherreg_entry: .long .Lor_after - .Lor_table\n"
    ".Ltk_table: .long 0\ntaken_entry: .long .Ltk_after - .Ltk_table\n"
    ".Lfl_table: .long .Lfl_after - .Lfl_table\n"
    "fellbe_entry: .long .Lfl_after - .Lfl_table\n"
    ".Lfa_table: .rept 4200\n.long 0\n.endr\nfar_entry: .long .Lfa_after - .Lfa_table\n"
    ".data\n.p2align 3\nleaplain_slot: .quad 0\ndistance_slot: .quad 0\n.text\n");

long plain(long), fnbase(long), fnbase_other(long), arith(long), arith_other(long);
long far(long), far_other(long), cut(long), cut_other(long), cut_peek(void), leaadd(long);
long leaadd_other(long), unbound(long), unbound_other(long), leaplain(long);
long leaplain_other(long), otherreg(long), otherreg_other(long), taken(long);
long taken_other(long), fellbe(long), fellbe_other(long), distance(long);
long distance_other(long);

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (long k = 0; k < n; k++)
        printf("%ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld "
               "%ld %ld %ld %ld %ld %ld\n", plain(k), fnbase(k),
               fnbase_other(k), arith(k), arith_other(k), far(k), far_other(k), cut(k),
               cut_other(k), cut_peek() + 0L, leaadd(k), leaadd_other(k), unbound(k),
               unbound_other(k), leaplain(k), leaplain_other(k), otherreg(k),
               otherreg_other(k), taken(k), taken_other(k), fellbe(k), fellbe_other(k),
               distance(k), distance_other(k));
    return 0;
}
