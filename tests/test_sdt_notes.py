"""The same fixture sources built with systemtap's <sys/sdt.h> and with usdtpatch's give notes
equal field by field except pc; every site of ours is a kernel-optimizable nop5, guarded
against the red zone by default.

Sources: tests/data/sdt/{probes.c, sema.c, forms.c, probes_asm.S} (C: 0..12 arguments, every
operand kind, semaphores tested directly and through dtrace -h style _ENABLED() macros,
STAP_PROBEV, DTRACE_PROBE*, quoted provider and probe names, names that are macros, arguments
that fit no register, the assembler-side macros), tests/data/sdt/probes.cc (C++11 and later:
templates, inline functions in COMDAT groups, members, lambdas, cv-qualified and reference
values, enum classes, char/wchar_t/char16_t/char32_t) and tests/data/sdt/probes98.cc (the
same kinds that C++98 has).

Each configuration is built three times, all in parallel (2 workers): with systemtap's header,
with ours as a project gets it by default (the red-zone guard on), and with ours and
-DUSDTPATCH_REDZONE_GUARD=0 (what code built with -mno-red-zone uses).
- Unguarded, ours equals systemtap's field by field (provider, name, base, semaphore, argument
  specs), only the pc differs (the sites moved because the NOPs are longer).
- Guarded (the default), provider, name, base, semaphore, the argument count and each
  argument's size, sign and float flag equal systemtap's, but a guarded site's arguments are
  registers or immediates (the "nr" constraint: inside the guard rsp is 128 lower, so no
  operand may be rsp-relative): where systemtap's names a stack slot, ours names a register
  holding the same value. A probe with an argument that fits no register is not guarded: it
  gets systemtap's nop and operands (forms.c's odd and mixed, probes.c's longdouble,
  probes98.cc's big), but for the compiler's choice of register or stack slot, which the
  guarded probes around it change (seen with g++ -O3 and clang -O0).

The matrix, by default (64 configurations, 192 builds; every value of every axis, and every
pair of compiler, -O level and link kind in each language):
- every -O level (O0..O3) x every link kind (PIE, non-PIE, shared) at one standard per
  language (C: gnu11, C++: c++17), the compiler alternating over that grid (gcc, clang):
  24 configurations;
- every standard (C: c89, c99, gnu11, c17, c2x; C++: c++98, c++11, c++14, c++17, c++20,
  c++23 - clang 14 spells it c++2b) x both compilers at -O0 and -O2, PIE: 40 more.
USDTPATCH_SDT_FULL=1 builds the full cross product (264 configurations, 792 builds);
USDTPATCH_SDT_QUICK=1 takes the standards at -O2 only (44 configurations).

One known difference, allowed by name and checked otherwise: gcc compiling C at -O2/-O3 may
give a loop's probe arguments different registers. systemtap's header decides an argument's
signedness in C through a load of the extern `__sdt_unsp` and a `__builtin_constant_p` branch
that GCC folds only after inlining; those statements weigh in GCC's size estimates and change
its register choice in a loop (observed in operand_kinds(): `-4@%edx` vs `-4@%eax`). Ours
computes signedness as a constant expression. There, a register may be named differently,
with the same size, sign and float flag; every other field and operand must be equal.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import pytest

from tests.helpers import NOP5_GEN
from tests.test_sdt_support import (
    DATA,
    SDT_INCLUDE,
    BuildError,
    compare_notes,
    compare_notes_guarded,
    have,
    load_probes,
    readelf_notes,
    readelf_without_pc,
    run_cc,
    system_sdt_h,
)
from usdtpatch.analysis.candidacy import Outcome
from usdtpatch.analysis.check import OPTIMIZABLE, check
from usdtpatch.analysis.probes import ProbeSet
from usdtpatch.x86.nops import SiteForm, kernel_optimizable_nop5

OPTS = ("O0", "O1", "O2", "O3")
LINKS = ("pie", "nopie", "shared")
COMPILERS = ("gcc", "clang")
C_STDS = ("c89", "c99", "gnu11", "c17", "c2x")
CXX_STDS = ("c++98", "c++11", "c++14", "c++17", "c++20", "c++23")
VARIANTS = ("stap", "usdt", "noguard")  # systemtap's; ours by default; ours, guard off
# the probes that are not guarded in the default build: an argument fits no register
UNGUARDED = {"forms:odd", "forms:mixed", "fix:longdouble", "cxx98:big"}
LINK_FLAGS = {"pie": ["-fPIE", "-pie"], "nopie": ["-fno-pie", "-no-pie"],
              "shared": ["-fPIC", "-shared", "-DSDT_FIXTURE_LIB"]}


@dataclass(frozen=True, slots=True)
class Config:
    lang: str  # "c" or "c++"
    std: str
    compiler: str  # "gcc" or "clang"
    opt: str
    link: str

    @property
    def id(self) -> str:
        return f"{self.lang}-{self.std}-{self.compiler}-{self.opt}-{self.link}"

    @property
    def registers_may_differ(self) -> bool:
        return self.compiler == "gcc" and self.lang == "c" and self.opt in ("O2", "O3")

    def command(self, variant: str, out: Path) -> list[str]:
        std = self.std
        if self.compiler == "clang" and std == "c++23":
            std = "c++2b"
        if self.lang == "c":
            cc = self.compiler
            srcs = [DATA / "probes.c", DATA / "sema.c", DATA / "forms.c",
                    DATA / "probes_asm.S"]
        else:
            cc = "g++" if self.compiler == "gcc" else "clang++"
            srcs = [DATA / ("probes98.cc" if std == "c++98" else "probes.cc")]
        inc = {"stap": [], "usdt": [f"-I{SDT_INCLUDE}"],
               "noguard": [f"-I{SDT_INCLUDE}", "-DUSDTPATCH_REDZONE_GUARD=0"]}[variant]
        return [cc, f"-std={std}", f"-{self.opt}", *LINK_FLAGS[self.link], *inc,
                *map(str, srcs), "-o", str(out)]


def matrix() -> list[Config]:
    """The configurations: the full cross product with USDTPATCH_SDT_FULL=1; by default every
    pair of -O level, link kind and compiler at one standard per language, and every standard x
    compiler at -O0 (the red zone's own case) and -O2, PIE; USDTPATCH_SDT_QUICK=1 only the
    standards at -O2."""
    if os.environ.get("USDTPATCH_SDT_FULL"):
        return [Config(lang, std, compiler, opt, link)
                for lang, stds in (("c", C_STDS), ("c++", CXX_STDS)) for std in stds
                for compiler in COMPILERS for opt in OPTS for link in LINKS]
    out: list[Config] = []
    # Each -O level x link kind once per language, the compiler alternating over the grid:
    # every pair of (compiler, level), (compiler, link) and (level, link) is built, in half
    # the builds of the whole product.
    for lang, std in (("c", "gnu11"), ("c++", "c++17")):
        for i, opt in enumerate(OPTS):
            for j, link in enumerate(LINKS):
                out.append(Config(lang, std, COMPILERS[(i + j) % 2], opt, link))
    opts = ("O2",) if os.environ.get("USDTPATCH_SDT_QUICK") else ("O0", "O2")
    for lang, stds in (("c", C_STDS), ("c++", CXX_STDS)):
        for std in stds:
            for compiler in COMPILERS:
                for opt in opts:
                    cfg = Config(lang, std, compiler, opt, "pie")
                    if cfg not in out:
                        out.append(cfg)
    return out


MATRIX = matrix()


@dataclass(frozen=True, slots=True)
class Built:
    paths: dict[str, Path]  # variant -> the linked file
    error: str


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Config, Built]]:
    if not have("gcc", "g++", "clang", "clang++", "readelf"):
        pytest.skip("needs gcc, g++, clang, clang++ and readelf")
    if system_sdt_h() is None:
        pytest.skip("systemtap's sys/sdt.h is not installed (Debian systemtap-sdt-dev)")
    root = tmp_path_factory.mktemp("sdt-matrix")

    def build(job: tuple[Config, str]) -> tuple[Config, str, Path | None, str]:
        cfg, variant = job
        out = root / f"{cfg.id}-{variant}{'.so' if cfg.link == 'shared' else ''}"
        try:
            run_cc(cfg.command(variant, out))
        except BuildError as exc:
            return cfg, variant, None, str(exc)
        return cfg, variant, out, ""

    start = time.monotonic()
    jobs = [(cfg, v) for cfg in MATRIX for v in VARIANTS]
    paths: dict[Config, dict[str, Path]] = {cfg: {} for cfg in MATRIX}
    errors: dict[Config, str] = {cfg: "" for cfg in MATRIX}
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        for cfg, variant, out, err in pool.map(build, jobs):
            if out is not None:
                paths[cfg][variant] = out
            errors[cfg] += err
    elapsed = time.monotonic() - start
    print(f"\nsdt matrix: {len(jobs)} builds in {elapsed:.1f} s")
    yield {cfg: Built(paths[cfg], errors[cfg]) for cfg in MATRIX}


def _get(builds: dict[Config, Built], cfg: Config, variant: str = "noguard"
         ) -> tuple[ProbeSet, ProbeSet, Built]:
    b = builds[cfg]
    assert not b.error, b.error
    return load_probes(b.paths["stap"]), load_probes(b.paths[variant]), b


@pytest.mark.slow
@pytest.mark.needs_cc
@pytest.mark.parametrize("cfg", MATRIX, ids=[c.id for c in MATRIX])
def test_notes_equal_but_pc(builds: dict[Config, Built], cfg: Config) -> None:
    """Unguarded (-DUSDTPATCH_REDZONE_GUARD=0): every field but pc is systemtap's."""
    theirs, ours, _ = _get(builds, cfg)
    assert len(ours.probes) >= (35 if cfg.lang == "c" else 7)
    assert compare_notes(theirs, ours, cfg.registers_may_differ) == []


@pytest.mark.slow
@pytest.mark.needs_cc
@pytest.mark.parametrize("cfg", MATRIX, ids=[c.id for c in MATRIX])
def test_default_notes_agree(builds: dict[Config, Built], cfg: Config) -> None:
    """The default (guarded) build: the same probes, names, semaphores and argument types;
    register or immediate operands at guarded sites (see the module's doc)."""
    theirs, ours, _ = _get(builds, cfg, "usdt")
    assert compare_notes_guarded(theirs, ours) == []


@pytest.mark.slow
@pytest.mark.needs_cc
@pytest.mark.parametrize("cfg", MATRIX, ids=[c.id for c in MATRIX])
def test_readelf_agrees(builds: dict[Config, Built], cfg: Config) -> None:
    """readelf -n, an independent reader: the unguarded build and systemtap's agree but for
    Location, and it reads our notes (both builds) exactly as usdtpatch does."""
    b = builds[cfg]
    assert not b.error, b.error
    r_theirs = readelf_notes(b.paths["stap"])
    for variant in ("noguard", "usdt"):
        ours = load_probes(b.paths[variant])
        r_ours = readelf_notes(b.paths[variant])
        assert len(r_ours) == len(ours.probes)
        if variant == "noguard" and not cfg.registers_may_differ:
            assert readelf_without_pc(r_theirs) == readelf_without_pc(r_ours)
        assert r_ours == [{"provider": p.provider, "name": p.name, "pc": p.note.pc,
                           "base": p.note.base, "semaphore": p.note.semaphore,
                           "args": p.note.args} for p in ours.probes]


GUARD_IN = bytes([0x48, 0x8D, 0x64, 0x24, 0x80])  # lea -0x80(%rsp),%rsp
GUARD_OUT = bytes([0x48, 0x8D, 0xA4, 0x24, 0x80, 0x00, 0x00, 0x00])  # lea 0x80(%rsp),%rsp


@pytest.mark.slow
@pytest.mark.needs_cc
@pytest.mark.parametrize("cfg", MATRIX, ids=[c.id for c in MATRIX])
def test_every_site_is_an_optimizable_nop5(builds: dict[Config, Built], cfg: Config) -> None:
    """The site rules directly, and `usdtpatch check`'s verdict (analysis.check.check): every
    unguarded site is an optimizable nop5; in the default build every site is a guarded one
    (but the probes that cannot be guarded, which are systemtap's nop), and check reports no
    red-zone-live there."""
    theirs, ours, _ = _get(builds, cfg)
    assert {p.code[:1] for p in theirs.probes} == {b"\x90"}  # systemtap: nop
    for p in ours.probes:
        assert p.site.form == SiteForm.NOP5, (p.probe_id, p.code.hex())
        assert kernel_optimizable_nop5(p.code), (p.probe_id, p.code.hex())
        assert p.address % 4096 <= 4091, f"{p.probe_id} at {p.address:#x} crosses a page"
    report = check(ours)
    assert len(report.sites) == len(ours.probes)
    for site in report.sites:
        assert site.outcome == OPTIMIZABLE, (site.probe.probe_id, site.outcome)
        assert site.candidacy.verdict(NOP5_GEN).outcome == Outcome.OPTIMIZED, site.probe.probe_id
    assert {s.outcome for s in check(theirs).sites} & {OPTIMIZABLE} == set()

    dflt = load_probes(builds[cfg].paths["usdt"])
    for p in dflt.probes:
        if p.probe_id in UNGUARDED:
            assert p.code[:1] == b"\x90", (p.probe_id, p.code.hex())
            continue
        if p.provider == "asmfix":  # probes_asm.S: the guard is off by default in .S files
            assert p.site.form == SiteForm.NOP5, (p.probe_id, p.code.hex())
            continue
        assert p.site.form == SiteForm.NOP5, (p.probe_id, p.code.hex())
        around = dflt.image.read_vaddr(p.address - 5, 18)
        assert around == GUARD_IN + around[5:10] + GUARD_OUT, (p.probe_id, around.hex())
    codes = {f.code for s in check(dflt).sites for f in s.findings}
    assert "red-zone-live" not in codes


def test_matrix_covers_the_issue() -> None:
    """The subset still has every value of every axis."""
    assert {c.opt for c in MATRIX} == set(OPTS)
    assert {c.link for c in MATRIX} == set(LINKS)
    assert {c.compiler for c in MATRIX} == set(COMPILERS)
    assert {c.std for c in MATRIX} == set(C_STDS) | set(CXX_STDS)
    for lang in ("c", "c++"):  # every pair of two axes, in each language
        cfgs = [c for c in MATRIX if c.lang == lang]
        assert {(c.compiler, c.opt) for c in cfgs} >= set(product(COMPILERS, OPTS))
        assert {(c.compiler, c.link) for c in cfgs} >= set(product(COMPILERS, LINKS))
        assert {(c.opt, c.link) for c in cfgs} >= set(product(OPTS, LINKS))
