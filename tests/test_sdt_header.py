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
    have,
    load_probes,
    need_toolchain,
    rsp_relative,
    run_cc,
)
from usdtpatch.elf.image import parse_elf
from usdtpatch.sites.probes import ProbeSet
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


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize("form", list(FORMS))
def test_site_form(tmp_path: Path, form: str, cc: str) -> None:
    need_toolchain(cc)
    expected, forms = FORMS[form]
    base = load_probes(_build(tmp_path, "nop5", SMALL, ["-O2", f"-I{SDT_INCLUDE}"], cc))
    built = load_probes(_build(tmp_path, form, SMALL,
                               ["-O2", f"-I{SDT_INCLUDE}", f"-DUSDTPATCH_SITE_FORM={form}"], cc))
    assert {p.name for p in built.probes} == {"zero", "three", "two"}  # clang also inlines
    for p in built.probes:
        assert p.code.startswith(expected), (p.probe_id, p.code.hex())
        assert p.site.form in forms
    # the form changes the site only: the notes are those of the default build
    assert compare_notes(base, built) == []


def test_nop5_is_the_default_and_optimizable(tmp_path: Path) -> None:
    need_toolchain("gcc")
    ps = load_probes(_build(tmp_path, "dflt", SMALL, ["-O2", f"-I{SDT_INCLUDE}"]))
    assert ps.probes and all(kernel_optimizable_nop5(p.code) for p in ps.probes)


@pytest.mark.parametrize("form", ["nop7", "NOP5", "combo", "1"])
def test_unknown_form_is_a_compile_error(tmp_path: Path, form: str) -> None:
    need_toolchain("gcc")
    with pytest.raises(BuildError, match="USDTPATCH_SITE_FORM must be one of"):
        _build(tmp_path, "bad", SMALL, [f"-I{SDT_INCLUDE}", f"-DUSDTPATCH_SITE_FORM={form}"])


def _guard_layout(ps: ProbeSet, site: bytes) -> None:
    """Every site is `lea -0x80(%rsp),%rsp; <site>; lea 0x80(%rsp),%rsp`, pc on the site."""
    assert ps.probes
    for p in ps.probes:
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
    assert rsp_relative(ps) == []
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
    need_toolchain("gcc")
    obj = tmp_path / "asm.o"
    run_cc(["gcc", "-c", f"-I{SDT_INCLUDE}", "-DUSDTPATCH_REDZONE_GUARD",
            str(DATA / "probes_asm.S"), "-o", str(obj)])
    image = parse_elf(obj.read_bytes())
    text = image.section(".text")
    assert text is not None
    code = image.section_data(text)
    assert code.startswith(GUARD_IN + NOP5 + GUARD_OUT + GUARD_IN + NOP5 + GUARD_OUT)


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
    need_toolchain(cc)
    stap = load_probes(_build(tmp_path, "stap", PROBE_ASM, ["-O2", "-std=gnu99"], cc))
    ours = load_probes(_build(tmp_path, "usdt", PROBE_ASM,
                              ["-O2", "-std=gnu99", f"-I{SDT_INCLUDE}"], cc))
    assert [p.name for p in ours.probes][:3] == ["tmpl", "literal", "basic"]
    assert [p.note.args for p in ours.probes][1:3] == ["-4@%edi 8@g(%rip)", "8@%rsi"]
    assert compare_notes(stap, ours) == []
    assert all(p.site.form == SiteForm.NOP5 for p in ours.probes)


@pytest.mark.parametrize(("cc", "std", "src"), [
    ("gcc", "c99", "probes.c"), ("clang", "c99", "probes.c"), ("gcc", "c2x", "probes.c"),
    ("g++", "c++11", "probes.cc"), ("clang++", "c++11", "probes.cc"),
    ("g++", "c++23", "probes.cc"), ("clang++", "c++2b", "probes.cc"),
], ids=str)
def test_no_warnings(tmp_path: Path, cc: str, std: str, src: str) -> None:
    """-Wall -Wextra -pedantic -Werror: our header adds no warning. Left out: C89 (ISO C90
    limits string literals to 509 characters, which systemtap's probes exceed as well) and
    -pedantic for sema.c, whose STAP_PROBEV(p, n) with no argument needs GNU
    `, ##__VA_ARGS__` - the API is that way in systemtap's header too."""
    need_toolchain(cc)
    run_cc([cc, f"-std={std}", "-O2", "-Wall", "-Wextra", "-pedantic", "-Werror",
            f"-I{SDT_INCLUDE}", "-c", str(DATA / src), "-o", str(tmp_path / "o.o")])
    if src == "probes.c":
        run_cc([cc, f"-std={std}", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{SDT_INCLUDE}",
                "-c", str(DATA / "sema.c"), "-o", str(tmp_path / "e.o")])


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


def test_check_accepts_guarded_sites(tmp_path: Path) -> None:
    """`usdtpatch check` (sites.check) flags live red-zone data at the unguarded nop5 sites of
    the fixture, and none at the guarded ones."""
    need_toolchain("gcc")
    from usdtpatch.sites.check import check

    codes: dict[str, set[str]] = {}
    for name, extra in (("nop5", []), ("guarded", ["-DUSDTPATCH_REDZONE_GUARD"])):
        out = tmp_path / name
        run_cc(["gcc", "-O2", f"-I{SDT_INCLUDE}", *extra, str(DATA / "probes.c"),
                str(DATA / "sema.c"), "-o", str(out)])
        report = check(load_probes(out))
        codes[name] = {f.code for s in report.sites for f in s.findings}
    assert "red-zone-live" in codes["nop5"]
    assert "red-zone-live" not in codes["guarded"]
