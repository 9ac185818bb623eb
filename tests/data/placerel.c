/* placerel.c: place-relative words naming code (issue 46, class 1;
 * tests/test_analysis_placerel.py). Userspace static keys as the kernel builds them with
 * `asm goto`: each __jump_table entry is `.long site - ., target - .`, and main enables every
 * key at start (writes `jmp target` over the site's 2- or 5-byte NOP); and a kernel-style
 * __ex_table of fault fixups (`.long insn - ., fixup - .`), which a SIGSEGV handler looks the
 * faulting pc up in. No relocation and no absolute word holds these addresses.
 *   skey_after: the key's site follows the probe (a window would move it: the patch lands
 *     on the original bytes);
 *   skey_target: the key's jump target follows the probe (strictly inside its windows);
 *   fault: the instruction after the probe can fault and is named by __ex_table;
 *   plain: none. */
#define _GNU_SOURCE  /* REG_RIP */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include "custom_note.h"

#define FUNC(NAME) ".globl " NAME "\n.type " NAME ", @function\n.p2align 4\n" NAME \
    ":\n.cfi_startproc\n"
#define END(NAME) ".cfi_endproc\n.size " NAME ", .-" NAME "\n"
#define NOTE(NAME) CN_NOTE("990b", "0", "placerel", NAME, "8@%rax")
#define JUMP_ENTRY(SITE, TARGET) ".pushsection __jump_table, \"a\"\n.balign 4\n" \
    ".long " SITE " - ., " TARGET " - .\n.popsection\n"
#define EX_ENTRY(INSN, FIXUP) ".pushsection __ex_table, \"a\"\n.balign 4\n" \
    ".long " INSN " - ., " FIXUP " - .\n.popsection\n"
#define NOP5 ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"  /* patched to jmp rel32 */
#define NOP2 ".byte 0x66, 0x90\n"  /* patched to jmp rel8 */

asm(".text\n"
    FUNC("plain") "\tmov %rdi, %rax\n990: nop\n\tadd $1, %rax\n\tret\n" END("plain")
    NOTE("plain")
    /* enabled: x + 100; disabled: x + 1 */
    FUNC("skey_after") "\tmov %rdi, %rax\n990: nop\n"
    "1: " NOP2 "\tadd $1, %rax\n\tret\n"
    "2:\tadd $100, %rax\n\tret\n" END("skey_after")
    NOTE("skey_after") JUMP_ENTRY("1b", "2b")
    /* enabled: x + 2; disabled: x + 3 */
    FUNC("skey_target") "\tmov %rdi, %rax\n"
    "1: " NOP5 "\tadd $1, %rax\n990: nop\n"
    "2:\tadd $2, %rax\n\tret\n" END("skey_target")
    NOTE("skey_target") JUMP_ENTRY("1b", "2b")
    /* *p + 1, or -1 when p faults */
    FUNC("fault") "\txor %eax, %eax\n990: nop\n"
    "1:\tmov (%rdi), %rax\n\tadd $1, %rax\n\tret\n"
    "2:\tmov $-1, %rax\n\tret\n" END("fault")
    NOTE("fault") EX_ENTRY("1b", "2b")
    CN_BASE);

long plain(long), skey_after(long), skey_target(long), fault(long *);

struct entry { int32_t from, to; };
extern struct entry __start___jump_table[], __stop___jump_table[];
extern struct entry __start___ex_table[], __stop___ex_table[];

static uintptr_t at(const int32_t *field) { return (uintptr_t)field + *field; }

static void enable_keys(void)
{
    long page = sysconf(_SC_PAGESIZE);
    for (struct entry *e = __start___jump_table; e < __stop___jump_table; e++) {
        unsigned char *site = (unsigned char *)at(&e->from);
        int size = site[0] == 0x66 ? 2 : 5;
        int32_t rel = (int32_t)(at(&e->to) - ((uintptr_t)site + size));
        uintptr_t lo = (uintptr_t)site & -(uintptr_t)page;
        if (mprotect((void *)lo, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC) != 0)
            abort();
        if (size == 2) {
            site[0] = 0xeb;
            site[1] = (unsigned char)(signed char)rel;
        } else {
            site[0] = 0xe9;
            memcpy(site + 1, &rel, 4);
        }
        mprotect((void *)lo, 2 * page, PROT_READ | PROT_EXEC);
    }
}

static void on_fault(int sig, siginfo_t *si, void *ctx)
{
    ucontext_t *uc = ctx;
    (void)si;
    for (struct entry *e = __start___ex_table; e < __stop___ex_table; e++)
        if (at(&e->from) == (uintptr_t)uc->uc_mcontext.gregs[REG_RIP]) {
            uc->uc_mcontext.gregs[REG_RIP] = (greg_t)at(&e->to);
            return;
        }
    signal(sig, SIG_DFL);  /* no fixup: the fault is fatal */
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    printf("off %ld %ld\n", skey_after(1), skey_target(1));
    enable_keys();
    for (long k = 0; k < n; k++) {
        long v = k * 10;
        printf("%ld %ld %ld %ld %ld\n", plain(k), skey_after(k), skey_target(k), fault(&v),
               fault((long *)0));
    }
    return 0;
}
