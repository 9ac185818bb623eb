"""sdt_headers/sys/sdt.h: the site forms, the red-zone guard, STAP_PROBE_ASM, the assembler
side, warnings, and the architectures where it must stay a 1-byte nop.

Byte literals (what the header must emit):
  0f 1f 44 00 00                    nopl 0x0(%rax,%rax,1)                 nop5
  90 0f 1f 44 00 00                 nop; nopl 0x0(%rax,%rax,1)            combo5
  90 66 2e 0f 1f 84 00 00 00 00 00  nop; cs nopw 0x0(%rax,%rax,1)         combo10
  90                                nop                                   nop1
  48 8d 64 24 80                    lea -0x80(%rsp),%rsp                  guard in
  48 8d a4 24 80 00 00 00           lea 0x80(%rsp),%rsp                   guard out
  1f 20 03 d5                       nop (aarch64)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.test_sdt_support import (
    DATA,
    SDT_INCLUDE,
    BuildError,
    compare_notes,
    compare_notes_guarded,
    have,
    load_probes,
    need_toolchain,
    rsp_relative,
    run_cc,
)
from usdtpatch.analysis.probes import ProbeSet
from usdtpatch.elf.args import MemOperand
from usdtpatch.elf.image import parse_elf
from usdtpatch.x86.nops import COMBO5, COMBO10, NOP1, NOP5, SiteForm, kernel_optimizable_nop5

pytestmark = pytest.mark.needs_cc

GUARD_IN = bytes([0x48, 0x8D, 0x64, 0x24, 0x80])  # lea -0x80(%rsp),%rsp
GUARD_OUT = bytes([0x48, 0x8D, 0xA4, 0x24, 0x80, 0x00, 0x00, 0x00])  # lea 0x80(%rsp),%rsp
AARCH64_NOP = bytes([0x1F, 0x20, 0x03, 0xD5])  # nop

FORMS = {
    "nop5": (NOP5, {SiteForm.NOP5}),
    "combo5": (COMBO5, {SiteForm.COMBO5}),
    "combo10": (COMBO10, {SiteForm.COMBO10}),
    # consecutive 1-byte probes read as padding: both are the classic site
    "nop1": (NOP1, {SiteForm.NOP1, SiteForm.PADDED}),
}

SMALL = r"""
#include <sys/sdt.h>
volatile int sink;
int work(int a, long b, double c) {
  STAP_PROBE(small, zero);
  STAP_PROBE3(small, three, a, b, c);
  sink = a;
  STAP_PROBE2(small, two, sink, &sink);
  return a + (int)b;
}
int main(int argc, char **argv) { (void)argv; return work(argc, 2, 3.0) == 99; }
"""


def _build(tmp: Path, name: str, source: str, flags: list[str], cc: str = "gcc",
           suffix: str = ".c") -> Path:
    src = tmp / f"{name}{suffix}"
    src.write_text(source)
    out = tmp / name
    run_cc([cc, *flags, str(src), "-o", str(out)])
    return out


NOGUARD = "-DUSDTPATCH_REDZONE_GUARD=0"


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize("form", list(FORMS))
def test_site_form(tmp_path: Path, form: str, cc: str) -> None:
    need_toolchain(cc)
    expected, forms = FORMS[form]
    base = load_probes(_build(tmp_path, "nop5", SMALL, ["-O2", f"-I{SDT_INCLUDE}", NOGUARD],
                              cc))
    built = load_probes(_build(tmp_path, form, SMALL,
                               ["-O2", f"-I{SDT_INCLUDE}", f"-DUSDTPATCH_SITE_FORM={form}",
                                NOGUARD], cc))
    assert {p.name for p in built.probes} == {"zero", "three", "two"}  # clang also inlines
    for p in built.probes:
        assert p.code.startswith(expected), (p.probe_id, p.code.hex())
        assert p.site.form in forms
    # the form changes the site only: the notes are those of the nop5 build
    assert compare_notes(base, built) == []


def _guarded_sites(ps: ProbeSet) -> list[bool]:
    return [ps.image.read_vaddr(p.address - len(GUARD_IN), len(GUARD_IN)) == GUARD_IN
            for p in ps.probes]


@pytest.mark.parametrize(("flags", "guarded"), [
    ([], True),  # the default: safe
    (["-DUSDTPATCH_SITE_FORM=combo5"], True),
    (["-DUSDTPATCH_SITE_FORM=combo10"], False),  # the nop10 kernels guard it themselves
    (["-DUSDTPATCH_SITE_FORM=nop1"], False),  # never optimized
    ([NOGUARD], False),  # the build says: no red zone (-mno-red-zone)
    (["-DUSDTPATCH_REDZONE_GUARD=1", "-DUSDTPATCH_SITE_FORM=combo10"], True),
    (["-DUSDTPATCH_REDZONE_GUARD"], True),  # as -D defines it: 1
    (["-DUSDTPATCH_REDZONE_GUARD="], True),  # defined empty: asked for
    (["-D__KERNEL__", "-mno-red-zone"], False),  # kernel code has no red zone
], ids=["default", "combo5", "combo10", "nop1", "off", "on-combo10", "on", "empty", "kernel"])
def test_redzone_guard_default(tmp_path: Path, flags: list[str], guarded: bool) -> None:
    """The red-zone guard is on unless the build says the code has no red zone."""
    need_toolchain("gcc")
    ps = load_probes(_build(tmp_path, "g", SMALL, ["-O2", f"-I{SDT_INCLUDE}", *flags]))
    assert len(ps.probes) == 3
    assert _guarded_sites(ps) == [guarded] * 3
    if guarded:
        assert rsp_relative(ps) == []


def test_nop5_is_the_default_and_optimizable(tmp_path: Path) -> None:
    need_toolchain("gcc")
    ps = load_probes(_build(tmp_path, "dflt", SMALL, ["-O2", f"-I{SDT_INCLUDE}"]))
    assert ps.probes and all(kernel_optimizable_nop5(p.code) for p in ps.probes)


@pytest.mark.parametrize("form", ["nop7", "NOP5", "combo", "1"])
def test_unknown_form_is_a_compile_error(tmp_path: Path, form: str) -> None:
    need_toolchain("gcc")
    with pytest.raises(BuildError, match="USDTPATCH_SITE_FORM must be one of"):
        _build(tmp_path, "bad", SMALL, [f"-I{SDT_INCLUDE}", f"-DUSDTPATCH_SITE_FORM={form}"])


UNGUARDED = {"fix:longdouble"}  # an argument that fits no register: systemtap's nop


def _guard_layout(ps: ProbeSet, site: bytes) -> None:
    """Every site is `lea -0x80(%rsp),%rsp; <site>; lea 0x80(%rsp),%rsp`, pc on the site
    (but a probe whose arguments do not all fit a register: a 1-byte nop)."""
    assert ps.probes
    for p in ps.probes:
        if p.probe_id in UNGUARDED:
            assert p.code[:1] == NOP1, (p.probe_id, p.code.hex())
            continue
        around = ps.image.read_vaddr(p.address - len(GUARD_IN),
                                     len(GUARD_IN) + len(site) + len(GUARD_OUT))
        assert around == GUARD_IN + site + GUARD_OUT, (p.probe_id, around.hex())


@pytest.mark.parametrize("opt", ["O0", "O2"])
@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_redzone_guard_c(tmp_path: Path, cc: str, opt: str) -> None:
    """The guarded form wraps the site and describes no argument through %rsp (arguments
    are forced into registers or immediates), while systemtap's build of the same source does
    use %rsp-relative arguments at -O2 (a leaf's locals below rsp): the checker sees them."""
    need_toolchain(cc)
    srcs = [str(DATA / "probes.c"), str(DATA / "sema.c")]
    out = tmp_path / "guarded"
    run_cc([cc, f"-{opt}", f"-I{SDT_INCLUDE}", "-DUSDTPATCH_REDZONE_GUARD", *srcs,
            "-o", str(out)])
    ps = load_probes(out)
    assert len(ps.probes) >= 30
    _guard_layout(ps, NOP5)
    # (the unguarded long double probe may use rsp: its site is systemtap's nop)
    assert [r for r in rsp_relative(ps) if r.split(": ")[0] not in UNGUARDED] == []
    subprocess.run([str(out)], check=True, timeout=20)
    if opt == "O2" and cc == "gcc":
        stap = tmp_path / "stap"
        run_cc([cc, f"-{opt}", *srcs, "-o", str(stap)])
        assert rsp_relative(load_probes(stap)), "the fixture should exercise rsp operands"


def test_redzone_guard_cxx_and_combo10(tmp_path: Path) -> None:
    need_toolchain("g++")
    out = tmp_path / "guarded"
    run_cc(["g++", "-O2", f"-I{SDT_INCLUDE}", "-DUSDTPATCH_REDZONE_GUARD",
            "-DUSDTPATCH_SITE_FORM=combo10", str(DATA / "probes.cc"), "-o", str(out)])
    ps = load_probes(out)
    _guard_layout(ps, COMBO10)
    assert rsp_relative(ps) == []


def test_redzone_guard_assembler(tmp_path: Path) -> None:
    """In .S files the guard is asked for (the note operands are hand-written text: an
    rsp-relative one would be read 128 bytes off inside the guard); by default a plain nop5."""
    need_toolchain("gcc")
    codes = []
    for name, flags in (("guarded", ["-DUSDTPATCH_REDZONE_GUARD"]), ("default", [])):
        obj = tmp_path / f"{name}.o"
        run_cc(["gcc", "-c", f"-I{SDT_INCLUDE}", *flags, str(DATA / "probes_asm.S"),
                "-o", str(obj)])
        image = parse_elf(obj.read_bytes())
        text = image.section(".text")
        assert text is not None
        codes.append(image.section_data(text))
    assert codes[0].startswith(GUARD_IN + NOP5 + GUARD_OUT + GUARD_IN + NOP5 + GUARD_OUT)
    assert codes[1].startswith(NOP5 + NOP5) and GUARD_IN not in codes[1]


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_assembler_side_matches_systemtap(tmp_path: Path, cc: str) -> None:
    need_toolchain(cc)
    objs = []
    for name, inc in (("stap", []), ("usdt", [f"-I{SDT_INCLUDE}"])):
        obj = tmp_path / f"{name}.o"
        run_cc([cc, "-c", *inc, str(DATA / "probes_asm.S"), "-o", str(obj)])
        objs.append(load_probes(obj))
    assert [p.name for p in objs[1].probes] == ["zero", "one", "three", "twelve"]
    assert compare_notes(objs[0], objs[1]) == []


PROBE_ASM = r"""
#include <sys/sdt.h>
int g = 3;
int f(int a, long b) {
  int out;
  __asm__ __volatile__("movl %[in], %[out]\n"
                       STAP_PROBE_ASM(pasm, tmpl, STAP_PROBE_ASM_TEMPLATE(2))
                       : [out] "=r"(out)
                       : [in] "r"(a), STAP_PROBE_ASM_OPERANDS(2, a, b));
  __asm__ __volatile__(STAP_PROBE_ASM(pasm, literal, -4@%%edi 8@g(%%rip)) :: "D"(a));
  __asm__ (STAP_PROBE_ASM(pasm, basic, 8@%rsi));
  return out + g;
}
int main(int argc, char **argv) { (void)argv; return f(argc, 2) == 99; }
"""


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_probe_asm_matches_systemtap(tmp_path: Path, cc: str) -> None:
    """Unguarded, the notes are systemtap's; guarded (the default), the template's operands
    are registers or immediates and the hand-written ones are the text as written."""
    need_toolchain(cc)
    stap = load_probes(_build(tmp_path, "stap", PROBE_ASM, ["-O2", "-std=gnu99"], cc))
    ours = load_probes(_build(tmp_path, "usdt", PROBE_ASM,
                              ["-O2", "-std=gnu99", f"-I{SDT_INCLUDE}", NOGUARD], cc))
    assert [p.name for p in ours.probes][:3] == ["tmpl", "literal", "basic"]
    assert [p.note.args for p in ours.probes][1:3] == ["-4@%edi 8@g(%rip)", "8@%rsi"]
    assert compare_notes(stap, ours) == []
    assert all(p.site.form == SiteForm.NOP5 for p in ours.probes)
    dflt = load_probes(_build(tmp_path, "dflt", PROBE_ASM,
                              ["-O2", "-std=gnu99", f"-I{SDT_INCLUDE}"], cc))
    assert [p.note.args for p in dflt.probes][1:3] == ["-4@%edi 8@g(%rip)", "8@%rsi"]
    assert [(a.size, a.signed) for a in dflt.probes[0].args] == \
        [(a.size, a.signed) for a in stap.probes[0].args]
    assert not [a for a in dflt.probes[0].args if isinstance(a.operand, MemOperand)]
    assert _guarded_sites(dflt) == [True] * len(dflt.probes)


_WARN_CASES = [(cc, std, src) for cc in ("gcc", "clang")
               for std in ("c89", "c99", "gnu11", "c17", "c2x") for src in ("forms.c",)] + [
    (cc, std, "probes.c") for cc in ("gcc", "clang") for std in ("c99", "gnu11", "c17")] + [
    (cc, std, "probes98.cc") for cc in ("g++", "clang++") for std in ("c++98", "c++03")] + [
    (cc, std, "probes.cc") for cc in ("g++", "clang++")
    for std in ("c++11", "c++14", "c++17", "c++20")]


@pytest.mark.parametrize(("cc", "std", "src"), _WARN_CASES, ids=str)
@pytest.mark.parametrize("guard", ["default", "off"])
def test_no_warnings(tmp_path: Path, cc: str, std: str, src: str, guard: str) -> None:
    """-Wall -Wextra -pedantic -Werror: our header adds no warning, guarded (the default) or
    not, from C89 and C++98 on (forms.c is the C89 fixture; probes.c uses long long, which
    C89 lacks). Left out: -pedantic for sema.c, whose STAP_PROBEV(p, n) with no argument
    needs GNU `, ##__VA_ARGS__` - the API is that way in systemtap's header too - and -O0
    with gcc for the 16-byte arguments of forms.c, where gcc warns "unsupported size for
    integer register" with systemtap's header as with ours (and g++ at -O2 for probes98.cc's
    16-byte struct argument, left out with SDT_NO_BIG_ARG)."""
    need_toolchain(cc)
    flags = [f"-I{SDT_INCLUDE}", "-DSDT_NO_BIG_ARG"] + ([NOGUARD] if guard == "off" else [])
    run_cc([cc, f"-std={std}", "-O2", "-Wall", "-Wextra", "-pedantic", "-Werror",
            "-Wunreachable-code", *flags, "-c", str(DATA / src), "-o", str(tmp_path / "o.o")])
    if src == "probes.c":
        run_cc([cc, f"-std={std}", "-O0", "-Wall", "-Wextra", "-Werror", *flags,
                "-c", str(DATA / "sema.c"), "-o", str(tmp_path / "e.o")])


QUOTED = r"""
#include <sys/sdt.h>
int main(int argc, char **argv) {
  int a = 1;
  (void)argv;
  DTRACE_PROBE1(test, "probe1", a);
  STAP_PROBE2("prov", name, argc, a);
  return 0;
}
"""


@pytest.mark.parametrize("opt", ["O0", "O2"])
@pytest.mark.parametrize("cc", ["gcc", "clang", "g++", "clang++"])
def test_quoted_names_match_systemtap(tmp_path: Path, cc: str, opt: str) -> None:
    """bpftrace's usdt_quoted_probe.c: DTRACE_PROBE1(test, "probe1", a). The quotes are part
    of the name in systemtap's note; ours compiles it (it gave `.asciz ""probe1""`, "junk at
    end of line") and writes the same note."""
    need_toolchain(cc)
    suffix = ".cc" if cc.endswith("++") else ".c"
    stap = load_probes(_build(tmp_path, "stap", QUOTED, [f"-{opt}"], cc, suffix))
    for name, flags in (("usdt", []), ("noguard", [NOGUARD])):
        ours = load_probes(_build(tmp_path, name, QUOTED, [f"-{opt}", f"-I{SDT_INCLUDE}",
                                                           *flags], cc, suffix))
        assert [(p.provider, p.name) for p in ours.probes] == [
            ("test", '"probe1"'), ('"prov"', "name")]
        if flags:
            assert compare_notes(stap, ours) == []
        else:
            assert compare_notes_guarded(stap, ours) == []


def test_i386_keeps_the_one_byte_nop(tmp_path: Path) -> None:
    """32-bit processes are never optimized: ours emits systemtap's nop there, the same code
    and the same notes (compiled only: no 32-bit libc is needed)."""
    need_toolchain("gcc")
    src = tmp_path / "small.c"
    src.write_text(SMALL)
    sets: list[ProbeSet] = []
    texts: list[bytes] = []
    for name, inc in (("stap", []), ("usdt", [f"-I{SDT_INCLUDE}"])):
        obj = tmp_path / f"{name}.o"
        try:
            run_cc(["gcc", "-m32", "-O2", "-ffreestanding", "-c", *inc,
                    "-isystem", "/usr/include/x86_64-linux-gnu", str(src), "-o", str(obj)])
        except BuildError as exc:
            pytest.skip(f"gcc cannot build 32-bit objects here: {str(exc).splitlines()[-1]}")
        sets.append(load_probes(obj))
        text = sets[-1].image.section(".text")
        assert text is not None
        texts.append(sets[-1].image.section_data(text))
    assert sets[1].image.word_size == 4
    assert texts[0] == texts[1]
    assert NOP5 not in texts[1]
    assert len(sets[1].probes) >= 3
    assert compare_notes(sets[0], sets[1]) == []


def test_aarch64_emits_its_nop(tmp_path: Path) -> None:
    need_toolchain("clang")
    src = tmp_path / "a.c"
    src.write_text("#include <sys/sdt.h>\nvoid f(long x) { STAP_PROBE1(arm, one, x); }\n")
    objs: list[ProbeSet] = []
    texts: list[bytes] = []
    for name, inc in (("stap", []), ("usdt", [f"-I{SDT_INCLUDE}"])):
        obj = tmp_path / f"{name}.o"
        try:
            run_cc(["clang", "--target=aarch64-linux-gnu", "-ffreestanding", "-O2", "-c",
                    *inc, "-isystem", "/usr/include/x86_64-linux-gnu", str(src),
                    "-o", str(obj)])
        except BuildError as exc:
            pytest.skip(f"clang cannot target aarch64 here: {str(exc).splitlines()[-1]}")
        objs.append(load_probes(obj))
        text = objs[-1].image.section(".text")
        assert text is not None
        texts.append(objs[-1].image.section_data(text))
    assert AARCH64_NOP in texts[1]
    assert texts[0] == texts[1]  # the very same code as systemtap's
    assert [p.note.args for p in objs[1].probes] == [p.note.args for p in objs[0].probes]
    assert len(objs[1].probes) == 1


def test_toolchain_present_for_ci() -> None:
    """Not a skip in disguise: CI installs these (Makefile system-packages)."""
    if not have("gcc", "clang"):
        pytest.skip("gcc or clang missing")
    assert (SDT_INCLUDE / "sys" / "sdt.h").is_file()


def test_cxx_include_inside_extern_c(tmp_path: Path) -> None:
    """Headers of C libraries get included inside extern "C" blocks; the type trait must not
    get C linkage (systemtap's header fails here: "template with C linkage")."""
    need_toolchain("g++", "clang++")
    src = "extern \"C\" {\n#include <sys/sdt.h>\n}\nint main(int c, char **) {\n" \
          "  STAP_PROBE1(ext, c, c);\n  return 0;\n}\n"
    for cxx in ("g++", "clang++"):
        ps = load_probes(_build(tmp_path, cxx, src, [f"-I{SDT_INCLUDE}"], cxx, ".cc"))
        assert len(ps.probes) == 1
        assert ps.probes[0].note.args.startswith("-4@")  # an int, signed
    with pytest.raises(BuildError, match="template with C linkage"):
        _build(tmp_path, "stap", src, [], "g++", ".cc")


@pytest.mark.parametrize(("opt", "srcs"), [
    ("O2", ["probes.c", "sema.c"]), ("O0", ["redzone_leaf.c"]), ("O0", ["probes.c", "sema.c"]),
])
def test_check_of_a_default_build_has_no_red_zone_live(tmp_path: Path, opt: str,
                                                       srcs: list[str]) -> None:
    """`usdtpatch check` (analysis.check) flags live red-zone data at the unguarded nop5 sites
    (-DUSDTPATCH_REDZONE_GUARD=0), and none in the default build: its sites are guarded."""
    need_toolchain("gcc")
    from usdtpatch.analysis.check import check

    codes: dict[str, set[str]] = {}
    for name, extra in (("nop5", [NOGUARD]), ("default", []),
                        ("asked", ["-DUSDTPATCH_REDZONE_GUARD"])):
        out = tmp_path / name
        run_cc(["gcc", f"-{opt}", f"-I{SDT_INCLUDE}", *extra,
                *(str(DATA / s) for s in srcs), "-o", str(out)])
        report = check(load_probes(out))
        codes[name] = {f.code for s in report.sites for f in s.findings
                       if f.severity.value == "error"}
    assert "red-zone-live" in codes["nop5"]
    assert "red-zone-live" not in codes["default"]
    assert "red-zone-live" not in codes["asked"]


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_no_red_zone_is_invisible_to_the_preprocessor(cc: str) -> None:
    """Why the build has to say -DUSDTPATCH_REDZONE_GUARD=0 for -mno-red-zone code: the
    compilers predefine the same macros with and without -mno-red-zone (if one ever tells,
    this fails and the header can detect it)."""
    need_toolchain(cc)
    macros = []
    for flags in ([], ["-mno-red-zone"]):
        proc = subprocess.run([cc, *flags, "-dM", "-E", "-x", "c", "-"], input="",
                              capture_output=True, text=True, check=True, timeout=60)
        macros.append(sorted(proc.stdout.splitlines()))
    assert len(macros[0]) > 100
    assert macros[0] == macros[1]
