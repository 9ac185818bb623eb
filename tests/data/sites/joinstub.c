/* Build: gcc -O1 -fPIE -static-pie -fno-omit-frame-pointer -g -I/usr/include/csmith -w -o joinstub joinstub.c
   (tools/fuzz_programs.py's pair 1-6968, csmith: p1 and p4's windows overlap their neighbours'
   and hold the stubs of their 8-bit ways in, in their filler; joined with them, each stub where
   it was; tests/test_rewrite_conversion.py) */
/*
 * This is a RANDOMLY GENERATED PROGRAM.
 *
 * Generator: csmith 2.3.0
 * Git version: 30dccd7
 * Options:   --seed 1006971 --max-funcs 3 --max-block-depth 2 --no-packed-struct --no-bitfields -o /tmp/pp6968/csmith.c
 * Seed:      1006971
 */

#include "csmith.h"
#include <sys/sdt.h>


static long __undefined;

/* --- Struct/Union Declarations --- */
/* --- GLOBAL VARIABLES --- */
static uint64_t g_2 = 0xAFE01BD97A888ADALL;


/* --- FORWARD DECLARATIONS --- */
static uint32_t  func_1(void);


/* --- FUNCTIONS --- */
/* ------------------------------------------ */
/* 
 * reads : g_2
 * writes:
 */
static uint32_t  func_1(void)
{ /* block id: 0 */
    return g_2;
}




/* ---------------------------------------- */
int main (int argc, char* argv[])
{
    int print_hash_value = 0;
    STAP_PROBE4(fz, p0, ((int16_t)((uint64_t)g_2 ^ (uint64_t)g_2)), g_2, g_2, (int8_t)-128LL);
    if (argc == 2 && strcmp(argv[1], "1") == 0) print_hash_value = 1;
    STAP_PROBE1(fz, p1, ((int64_t)((uint64_t)g_2 ^ (uint64_t)g_2)));
    platform_main_begin();
    STAP_PROBE3(fz, p2, g_2, ((int64_t)((uint64_t)g_2 - (uint64_t)g_2)), g_2);
    crc32_gentab();
    STAP_PROBE4(fz, p3, (int64_t)65535LL, ((uint64_t)((uint64_t)g_2 * (uint64_t)g_2)), (int64_t)g_2, ((uint16_t)((uint64_t)g_2 - (uint64_t)g_2)));
    func_1();
    STAP_PROBE2(fz, p4, (int32_t)g_2, g_2);
    transparent_crc(g_2, "g_2", print_hash_value);
    STAP_PROBE3(fz, p5, g_2, (int8_t)-78187493530LL, (uint32_t)g_2);
    platform_main_end(crc32_context ^ 0xFFFFFFFFUL, print_hash_value);
    STAP_PROBE1(fz, p6, g_2);
    return 0;
}

/************************ statistics *************************
XXX max struct depth: 0
breakdown:
   depth: 0, occurrence: 1
XXX total union variables: 0

XXX max expression depth: 1
breakdown:
   depth: 1, occurrence: 1

XXX total number of pointers: 0

XXX times a non-volatile is read: 1
XXX times a non-volatile is write: 0
XXX times a volatile is read: 0
XXX    times read thru a pointer: 0
XXX times a volatile is write: 0
XXX    times written thru a pointer: 0
XXX times a volatile is available for access: 0
XXX percentage of non-volatile access: 100

XXX forward jumps: 0
XXX backward jumps: 0

XXX stmts: 1
XXX max block depth: 0
breakdown:
   depth: 0, occurrence: 1

XXX percentage a fresh-made variable is used: 100
XXX percentage an existing variable is used: 0
********************* end of statistics **********************/

