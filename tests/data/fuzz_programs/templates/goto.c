/* Build: gcc -O2 -o goto goto.c (tools/fuzz_programs.py turns the PROBE markers into probes) */
/* Computed goto: a small interpreter dispatching through a table of label addresses. */
#include <stdio.h>
#include <stdint.h>
#include <sys/sdt.h>

static const unsigned char program[] = {0, 1, 2, 0, 3, 1, 2, 2, 0, 1, 3, 4};

static __attribute__((noinline)) int64_t run(int rounds)
{
    static void *ops[] = {&&op_add, &&op_mul, &&op_xor, &&op_sub, &&op_end};
    int64_t acc = 1;
    int pc = 0;
    int round = 0;
again:
    pc = 0;
    goto *ops[program[pc]];
op_add:
    acc += 5 + round;
    /*@PROBE acc, pc*/
    goto *ops[program[++pc]];
op_mul:
    acc *= 3;
    /*@PROBE acc, round, pc*/
    goto *ops[program[++pc]];
op_xor:
    acc ^= 0x1234;
    goto *ops[program[++pc]];
op_sub:
    /*@PROBE acc*/
    acc -= round;
    goto *ops[program[++pc]];
op_end:
    /*@PROBE round, acc*/
    if (++round < rounds)
        goto again;
    return acc;
}

int main(void)
{
    int64_t s = 0;
    for (int i = 1; i < 40; i++) {
        s += run(i);
        /*@PROBE i, s*/
    }
    printf("goto %lld\n", (long long)s);
    return 0;
}
