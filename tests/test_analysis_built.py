"""check on binaries built here with gcc/clang: the cases no committed fixture covers.

Each source uses fixtures/src/custom_note.h to place a probe note exactly where the case needs
it (inside an instruction, inside an rseq critical section, in code with no FDE or symbol,
with odd semaphores). The switch/cold source uses systemtap's sys/sdt.h and is built with gcc
(PIE and non-PIE) and clang, to exercise the jump-table patterns of both compilers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import ROOT, build_programs, run_cli
from usdtpatch.analysis.check import BLOCKED, CheckReport, SiteCheck, check
from usdtpatch.analysis.hazards import rseq_sections
from usdtpatch.analysis.targets import COLD_JUMP, JUMP_TABLE, CodeContext, FunctionCode
from usdtpatch.api import load
from usdtpatch.elf.cfi import load_cfi
from usdtpatch.elf.symbols import load_symbols
from usdtpatch.x86.decode import Flow

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]

BUILT_C = r"""
#include <stdio.h>
#include "custom_note.h"

__attribute__((section(".probes"), aligned(2), used)) unsigned char sem_pair[4];
__attribute__((used)) const unsigned short sem_ro = 0;
__attribute__((used)) unsigned short sem_data = 0;

/* window-branch-target: the nop and the instruction after it are both targets of jumps
 * from another part (their own FDEs), and both carry a global symbol (an entry anyone may
 * jump to, which no rewrite can aim at a detour): no window can hold either */
asm(".pushsection .text.targets, \"ax\", @progbits\n"
    ".globl both_targets\n.type both_targets, @function\n"
    "both_targets:\n.cfi_startproc\n"
    "mov %rdi, %rax\n\ttest %rax, %rax\n\tjne .Lbt_other\n"
    ".globl bt_nop_entry\n.type bt_nop_entry, @function\nbt_nop_entry:\n"
    ".Lbt_nop:\n990: nop\n"
    ".globl bt_join_entry\n.type bt_join_entry, @function\nbt_join_entry:\n"
    ".Lbt_join: add $1, %rax\n\tret\n"
    ".cfi_endproc\n.size both_targets, .-both_targets\n"
    CN_NOTE("990b", "0", "built", "both_targets", "") CN_BASE
    ".popsection\n"
    ".pushsection .text.unlikely.targets, \"ax\", @progbits\n"
    ".type bt_other, @function\n"
    "bt_other:\n.Lbt_other:\n.cfi_startproc\n"
    "sub $1, %rax\n\tjz .Lbt_nop\n\tjmp .Lbt_join\n"
    ".cfi_endproc\n.size bt_other, .-bt_other\n"
    ".popsection\n");
long both_targets(long);

/* window-call: the nop is followed by a call into the window itself (code reading its own
 * address: `call 1f; 1: pop`), which no rewrite may move or emulate; no window starts before
 * the function's entry */
asm(".pushsection .text.getpc, \"ax\", @progbits\n"
    ".globl getpc\n.type getpc, @function\n"
    "getpc:\n.cfi_startproc\n"
    "990: nop\n\tcall 1f\n1: pop %rax\n\tret\n"
    ".cfi_endproc\n.size getpc, .-getpc\n"
    CN_NOTE("990b", "0", "built", "getpc", "") CN_BASE
    ".popsection\n");
long getpc(void);

/* window-function-end: `nop; ret` as a whole function, the next one right after it and 140
   bytes of code before it (fend_0): no NOP within an 8-bit jump's reach for a short window's
   stub */
asm(".pushsection .text.fend, \"ax\", @progbits\n"
    ".globl fend_0\n.type fend_0, @function\n"
    "fend_0:\n.cfi_startproc\n\tmov %rdi, %rax\n"
    ".rept 34\n\tadd $1, %rax\n.endr\n\tret\n"
    ".cfi_endproc\n.size fend_0, .-fend_0\n"
    ".globl fend_a\n.type fend_a, @function\n"
    "fend_a:\n.cfi_startproc\n"
    "990: nop\n\tret\n"
    ".cfi_endproc\n.size fend_a, .-fend_a\n"
    ".globl fend_b\n.type fend_b, @function\n"
    "fend_b:\n.cfi_startproc\n"
    "mov %rdi, %rax\n\tret\n"
    ".cfi_endproc\n.size fend_b, .-fend_b\n"
    CN_NOTE("990b", "0", "built", "fend", "")
    ".popsection\n");
void fend_a(void);
long fend_b(long);

/* window-all-targets: an indirect jump no analysis understands */
__attribute__((noipa)) long computed(long x)
{
    long r;
    asm volatile("lea 1f(%%rip), %%rax\n\tadd %%rdi, %%rax\n\tjmp *%%rax\n"
                 "1: xor %%eax, %%eax\n"
                 "990: nop\n\tinc %%rax\n\tinc %%rax\n"
                 CN_NOTE("990b", "0", "built", "computed", "")
                 : "=a"(r) : "D"(x));
    return r;
}

/* probe-not-decoded: the note's pc points into the middle of an instruction */
__attribute__((noipa)) long middle(long x)
{
    long r;
    asm volatile("990: movabs $0x9090909090909090, %%rax\n"
                 CN_NOTE("990b+2", "0", "built", "middle", "")
                 : "=a"(r));
    return r + x;
}

/* semaphores: misaligned, read-only, outside .probes, unmapped */
__attribute__((noipa)) void semaphores(void)
{
    asm volatile("990: nop\n" CN_NOTE("990b", "sem_pair+1", "built", "sem_misaligned", ""));
    asm volatile("990: nop\n" CN_NOTE("990b", "sem_ro", "built", "sem_readonly", ""));
    asm volatile("990: nop\n" CN_NOTE("990b", "sem_data", "built", "sem_data", ""));
    asm volatile("990: nop\n" CN_NOTE("990b", "0x7fff0000", "built", "sem_unmapped", ""));
    asm volatile("990: nop\n" CN_NOTE("990b", "sem_pair", "built", "sem_good", ""));
}

/* window-no-function-bounds: code with neither an FDE nor a function symbol */
asm(".pushsection .text.nobounds, \"ax\", @progbits\n"
    "nobounds_code:\n"
    "990: nop\n\tret\n"
    CN_NOTE("990b", "0", "built", "nobounds", "")
    ".popsection\n");

/* site-in-rseq-cs: a probe inside a restartable sequence */
asm(".pushsection .text.rseq, \"ax\", @progbits\n"
    ".globl rseq_fn\n.type rseq_fn, @function\n"
    "rseq_fn:\n.cfi_startproc\n"
    "1: mov %rdi, %rax\n"
    "990: nop\n\tadd $1, %rax\n"
    "2: ret\n"
    ".long 0x53053053\n"
    "5: xor %eax, %eax\n\tret\n"
    ".cfi_endproc\n.size rseq_fn, .-rseq_fn\n"
    ".pushsection __rseq_cs, \"aw\"\n.balign 32\n.long 0, 0\n.quad 1b, 2b-1b, 5b\n.popsection\n"
    CN_NOTE("990b", "0", "built", "in_rseq", "")
    ".popsection\n");
long rseq_fn(long);

/* the same with a nop5 site: optimized as it is, but inside the critical section */
asm(".pushsection .text.rseq5, \"ax\", @progbits\n"
    ".globl rseq5_fn\n.type rseq5_fn, @function\n"
    "rseq5_fn:\n.cfi_startproc\n"
    "1: mov %rdi, %rax\n"
    "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n\tadd $1, %rax\n"
    "2: ret\n"
    ".long 0x53053053\n"
    "5: xor %eax, %eax\n\tret\n"
    ".cfi_endproc\n.size rseq5_fn, .-rseq5_fn\n"
    ".pushsection __rseq_cs, \"aw\"\n.balign 32\n.long 0, 0\n.quad 1b, 2b-1b, 5b\n.popsection\n"
    CN_NOTE("990b", "0", "built", "in_rseq_nop5", "")
    ".popsection\n");
long rseq5_fn(long);

/* a jump from another part (its own FDE, like GCC's .cold) to the instruction after the nop */
asm(".pushsection .text.parts, \"ax\", @progbits\n"
    ".globl part_a\n.type part_a, @function\n"
    "part_a:\n.cfi_startproc\n"
    "mov %rdi, %rax\n\ttest %rax, %rax\n\tjne part_b\n"
    "990: nop\n"
    ".Lpart_a_join: add $1, %rax\n\tret\n"
    ".cfi_endproc\n.size part_a, .-part_a\n"
    CN_NOTE("990b", "0", "built", "other_part", "")
    ".popsection\n"
    ".pushsection .text.unlikely.parts, \"ax\", @progbits\n"
    ".type part_b, @function\n"
    "part_b:\n.cfi_startproc\n"
    "add $2, %rax\n\tjmp .Lpart_a_join\n"
    ".cfi_endproc\n.size part_b, .-part_b\n"
    ".popsection\n");
long part_a(long);

int main(int argc, char **argv)
{
    (void)argv;
    semaphores();
    printf("%ld\n", both_targets(argc) + computed(argc - 1) + middle(argc) + rseq_fn(argc)
                    + rseq5_fn(argc) + part_a(argc) + fend_b(argc) + (getpc() != 0));
    fend_a();
    return 0;
}
"""

SWITCH_C = r"""
#include <stdio.h>
#include <sys/sdt.h>
__attribute__((noipa)) long sw(int op, long x)
{
    switch (op) {
    case 0: x += 3; break;
    case 1: x *= 7; break;
    case 2: x ^= 0x55; break;
    case 3: x -= 9; break;
    case 4: STAP_PROBE1(built, in_switch, x); x <<= 2; break;
    case 5: x = x / 3; break;
    case 6: x = -x; break;
    case 7: x += 100; break;
    }
    return x;
}
__attribute__((noipa)) long swm(int op, long x)
{
    switch (op & 7) {  /* no compare: the `and $7` bounds the table */
    case 0: x += 3; break;
    case 1: x *= 7; break;
    case 2: x ^= 0x55; break;
    case 3: x -= 9; break;
    case 4: STAP_PROBE1(built, in_masked, x); x <<= 2; break;
    case 5: x = x / 3; break;
    case 6: x = -x; break;
    case 7: x += 100; break;
    }
    return x;
}
__attribute__((noipa)) long cgoto(int n, long x)
{   /* computed goto: absolute label addresses (R_X86_64_RELATIVE in a PIE), the table base
       kept in a register across the dispatch points */
    static void *const tbl[] = {&&l0, &&l1, &&l2, &&l3, &&l4};
    int i = 0;
    goto *tbl[n % 5];
l0: x += 1; if (++i < 3) goto *tbl[(n + i) % 5]; return x;
l1: x *= 3; if (++i < 3) goto *tbl[(n + i) % 5]; return x;
l2: STAP_PROBE1(built, in_cgoto, x); x ^= 5; if (++i < 3) goto *tbl[(n + i) % 5]; return x;
l3: x -= 7; if (++i < 3) goto *tbl[(n + i) % 5]; return x;
l4: x <<= 1; if (++i < 3) goto *tbl[(n + i) % 5]; return x;
}
__attribute__((noipa, cold)) void slow(long x) { printf("slow %ld\n", x); }
__attribute__((noipa)) long hotcold(long x)
{
    for (long i = 0; i < x; i++) {
        if (__builtin_expect(i == 12345, 0)) {
            slow(i);
            STAP_PROBE1(built, cold_probe, i);
            x += 7;
        }
        x ^= i * 3;
    }
    return x;
}
int main(int argc, char **argv)
{
    (void)argv;
    printf("%ld %ld %ld %ld\n", sw(argc, 5), hotcold(argc), swm(argc, 3), cgoto(argc, 2));
    return 0;
}
"""

BUILDS = {
    "built": ("gcc", ["-O2", "-fPIE", "-pie", "-g0", f"-I{ROOT / 'fixtures' / 'src'}"], BUILT_C),
    "sw-gcc": ("gcc", ["-O2", "-fPIE", "-pie", "-g0"], SWITCH_C),
    "sw-nopie": ("gcc", ["-O2", "-fno-pie", "-no-pie", "-g0"], SWITCH_C),
    "sw-clang": ("clang", ["-O2", "-fPIE", "-pie", "-g0", "-Wno-unknown-attributes"], SWITCH_C),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("built")
    out: dict[str, Path] = {}
    for src, c in ((BUILT_C, "built.c"), (SWITCH_C, "switch.c")):
        out |= build_programs(d, src, {n: (cc, flags) for n, (cc, flags, s) in BUILDS.items()
                                       if s is src}, c)
    return out


def _report(path: Path) -> CheckReport:
    return check(load(str(path)))


def _site(r: CheckReport, name: str) -> SiteCheck:
    return next(s for s in r.sites if s.probe.name == name)


def _function(path: Path, s: SiteCheck) -> FunctionCode:
    ps = load(str(path))
    ctx = CodeContext(ps.image, load_cfi(ps.image), load_symbols(ps.image))
    assert s.function is not None
    return ctx.function(s.function)


@pytest.mark.parametrize(("probe", "code"), [
    ("both_targets", "window-branch-target"),
    ("computed", "window-all-targets"),
    ("middle", "probe-not-decoded"),
    ("nobounds", "window-no-function-bounds"),
    ("in_rseq", "site-in-rseq-cs"),
    ("fend", "window-function-end"),
    ("getpc", "window-call"),
], ids=["branch-target", "all-targets", "not-decoded", "no-bounds", "rseq", "function-end",
        "call-into-window"])
def test_blocked_sites_name_their_reason(built: dict[str, Path], probe: str, code: str) -> None:
    s = _site(_report(built["built"]), probe)
    assert s.outcome == BLOCKED
    assert s.blocked == code
    assert code in {f.code for f in s.findings}


@pytest.mark.parametrize(("probe", "codes"), [
    ("sem_misaligned", {"semaphore-misaligned"}),
    ("sem_readonly", {"semaphore-not-writable", "semaphore-not-in-probes"}),
    ("sem_data", {"semaphore-not-in-probes"}),
    ("sem_unmapped", {"semaphore-unmapped"}),
    ("sem_good", set()),
], ids=["misaligned", "readonly", "outside-probes", "unmapped", "good"])
def test_semaphore_sanity(built: dict[str, Path], probe: str, codes: set[str]) -> None:
    s = _site(_report(built["built"]), probe)
    assert {f.code for f in s.findings if f.code.startswith("semaphore-")} == codes


def test_rseq_abort_handler_is_a_target(built: dict[str, Path]) -> None:
    ps = load(str(built["built"]))
    ctx = CodeContext(ps.image, load_cfi(ps.image), load_symbols(ps.image))
    sections = rseq_sections(ctx)
    assert len(sections) == 2
    probe = next(p for p in ps.probes if p.name == "in_rseq")
    (cs,) = [c for c in sections if c.start < probe.address < c.end]
    ctx.rseq_aborts = tuple(c.abort for c in sections)
    bounds = ctx.bounds(probe.address)
    assert bounds is not None
    fc = ctx.function(bounds)
    assert fc.targets[cs.abort].kind == "rseq-abort"


@pytest.mark.parametrize("probe", ["in_switch", "in_masked"])
@pytest.mark.parametrize("name", ["sw-gcc", "sw-nopie", "sw-clang"])
def test_jump_tables_are_resolved(built: dict[str, Path], name: str, probe: str) -> None:
    if name not in built:
        pytest.skip(f"{BUILDS[name][0]} not installed")
    r = _report(built[name])
    sites = [s for s in r.sites if s.probe.name == probe]
    assert sites
    for s in sites:
        fc = _function(built[name], s)
        assert fc.all_targets is None
        assert fc.jump_tables  # one, or two when clang inlined both switches into main
        assert all(t.bounded and t.entries == 8 for t in fc.jump_tables)  # cmp $7/ja, and $7
        table = fc.jump_tables[0]
        # Eight cases, eight distinct case labels, each an instruction of the function.
        assert len(set(table.targets)) == 8
        assert all(fc.index_of(t) is not None for t in table.targets)
        assert {t for t, tg in fc.targets.items() if tg.kind == JUMP_TABLE} == {
            t for tb in fc.jump_tables for t in tb.targets}
        assert s.outcome != BLOCKED


def test_cold_part_jumps_back_are_targets(built: dict[str, Path]) -> None:
    path = built["sw-gcc"]
    ps = load(str(path))
    syms = load_symbols(ps.image)
    ctx = CodeContext(ps.image, load_cfi(ps.image), syms)
    hot = next(syms.addresses[i] for i in range(len(syms)) if syms.name_at(i) == "hotcold")
    bounds = ctx.bounds(hot)
    assert bounds is not None
    fc = ctx.function(bounds)
    cold = next(syms.addresses[i] for i in range(len(syms))
                if syms.name_at(i) == "hotcold.cold")
    cold_bounds = ctx.bounds(cold)
    assert cold_bounds is not None
    back = [i.target for i in ctx.sweep(cold_bounds.start, cold_bounds.end).insns
            if i.flow is Flow.JMP and i.target is not None and bounds.contains(i.target)]
    assert back, "gcc split hotcold: its cold part jumps back into it"
    for t in back:
        assert fc.is_target(t)
        assert fc.index_of(t) is not None
    # A jump from the other part that nothing in the hot part names is still found.
    only_cold = [t for t in fc.targets.values() if t.kind == COLD_JUMP]
    assert all(t.source is not None and cold_bounds.contains(t.source) for t in only_cold)


def test_check_cli_on_built_binary(built: dict[str, Path]) -> None:
    res = run_cli("check", built["built"])
    assert res.rc == 1  # semaphore errors reach the default --fail-on error
    assert "7 blocked" in res.out
    res = run_cli("check", "--fail-on", "never", built["built"])
    assert res.rc == 0


def test_jump_from_another_part_blocks_forward(built: dict[str, Path]) -> None:
    r = _report(built["built"])
    s = _site(r, "other_part")
    fc = _function(built["built"], s)
    join = s.probe.address + 1
    t = fc.target(join)
    assert t is not None and t.kind == COLD_JUMP
    assert t.source is not None and not fc.bounds.contains(t.source)
    # forward would have the join strictly inside; a backward window over `jne; nop` ends on it
    assert s.outcome == "backward"
    assert s.window is not None and s.window.window is not None
    assert s.window.window.end == join


def test_optimized_site_in_rseq_is_a_hazard_not_a_block(built: dict[str, Path]) -> None:
    s = _site(_report(built["built"]), "in_rseq_nop5")
    assert s.outcome == "optimizable"
    (f,) = [f for f in s.findings if f.code == "site-in-rseq-cs"]
    assert "syscall" in f.message


@pytest.mark.parametrize("name", ["sw-gcc", "sw-nopie", "sw-clang"])
def test_computed_goto_table(built: dict[str, Path], name: str) -> None:
    if name not in built:
        pytest.skip(f"{BUILDS[name][0]} not installed")
    r = _report(built[name])
    for s in [s for s in r.sites if s.probe.name == "in_cgoto"]:
        fc = _function(built[name], s)
        assert fc.all_targets is None, fc.all_targets
        assert fc.jump_tables
        labels = {t for table in fc.jump_tables for t in table.targets}
        assert len(labels) == 5  # &&l0 .. &&l4
        assert all(fc.index_of(t) is not None for t in labels)
        assert s.outcome != BLOCKED
