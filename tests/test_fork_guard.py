"""The fork guard without the kernel: the committed machine code against its source, what
sys/sdt.h embeds, what build_guard makes of each kind of file (and the files it must refuse),
what `rewrite` and `check` say about the fork hazard, and `restore` undoing the guard.

The guard at work in a forked child is tested on the real kernel in test_fork_header.py and
test_fork_rewrite_live.py, and in the emulator in test_fork_emulate.py.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.helpers import fixture
from tests.test_fork_support import SDT_INCLUDE, SRC, cc, need_cc
from usdtpatch import forkguard
from usdtpatch.analysis.guardfile import needed_objects
from usdtpatch.api import check, load, restore, rewrite
from usdtpatch.elf import model
from usdtpatch.elf.image import ElfImage, parse_elf
from usdtpatch.elf.model import DT_NEEDED, dynamic_entries
from usdtpatch.errors import UnsupportedError
from usdtpatch.forkguard import (
    CHILD_STUB,
    CODE_AT,
    ENTRY_SIZE,
    INIT_STUB,
    GuardUnsupported,
    _code,
    build_guard,
    coverage,
    header_table,
)
from usdtpatch.forkguard.recipe import RecipeError, build, compiler_version, header_block
from usdtpatch.x86.nops import COMBO10, NOP5

NOP5_ALT = bytes([0x66, 0x66, 0x66, 0x66, 0x90])  # data16 x4; nop


def _image(path: Path) -> ElfImage:
    return parse_elf(path.read_bytes())


# --- the committed code ---------------------------------------------------------------------

@pytest.mark.needs_cc
def test_committed_code_is_the_recipes_build_of_the_source() -> None:
    for tool in ("gcc", "objcopy", "nm"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    if compiler_version() != _code.COMPILER:
        pytest.skip(f"the committed code was built by {_code.COMPILER!r}, "
                    f"this machine has {compiler_version()!r}")
    try:
        built = build()
    except RecipeError as exc:  # pragma: no cover - a broken toolchain
        pytest.fail(str(exc))
    assert built.code == _code.CODE
    assert (built.rearm, built.rearm_end, built.register) == (
        _code.REARM, _code.REARM_END, _code.REGISTER)


def test_code_layout() -> None:
    assert _code.REARM == 0 < _code.REARM_END < _code.REGISTER < _code.BASE_END \
        <= _code.INTERPOSE < len(_code.CODE)
    # no absolute address anywhere: no movabs of a 64-bit immediate (48 b8+r imm64)
    assert not re.search(rb"[\x48\x49][\xb8-\xbf]", _code.CODE[:_code.REARM_END])
    assert b"/proc/self/mem\0" in _code.CODE[:_code.REARM_END]
    assert b"__register_atfork\0" in _code.CODE[_code.REARM_END:]
    assert b"_r_debug\0" in _code.CODE[_code.REARM_END:]


def test_header_embeds_the_committed_rearm_code() -> None:
    text = (SDT_INCLUDE / "sys" / "sdt.h").read_text()
    m = re.search(r"usdtpatch-forkguard-code begin \*/\\n\"\n(.*?)\n\s*\"/\* usdtpatch-forkguard"
                  r"-code end", text, re.S)
    assert m is not None
    lines = re.findall(r'"(\.byte [^"]*)\\n"', m[1])
    assert lines == header_block(_code.CODE[_code.REARM:_code.REARM_END])


def test_header_block_rejects_other_code() -> None:
    assert header_block(b"\x90\x90") != header_block(b"\x90\xcc")


# --- build_guard ----------------------------------------------------------------------------

def _place(image: ElfImage) -> int:
    return (max(s.vaddr + s.memsz for s in image.segments if s.type == 1) + 0x10FFF) & ~0xFFF


def _apply(image: ElfImage, patches: tuple[tuple[int, bytes], ...]) -> bytes:
    data = bytearray(image.data)
    for off, new in patches:
        data[off: off + len(new)] = new
    return bytes(data)


def _rip_target(text: bytes, at: int, base: int) -> int:
    """Target of the lea/jmp/call at text[at] (rip-relative)."""
    if text[at] in (0xE8, 0xE9):
        return base + at + 5 + int(struct.unpack_from("<i", text, at + 1)[0])
    assert text[at: at + 2] == b"\x48\x8d", text[at: at + 3].hex()
    return base + at + 7 + int(struct.unpack_from("<i", text, at + 3)[0])


@pytest.mark.parametrize("name", ["pie", "stripped", "cxx-throw", "demo"])
def test_pie_hooks_the_relative_relocation(name: str) -> None:
    image = _image(fixture(name))
    place = _place(image)
    sites = ((place + 0x800, NOP5), (place + 0x900, NOP5_ALT))
    g = build_guard(image, sites, place)
    assert "R_X86_64_RELATIVE" in g.hook
    assert g.sites == (place + 0x800, place + 0x900)
    # the child stub hands the table to rearm
    t = g.text
    assert _rip_target(t, CHILD_STUB, place) == g.table
    assert _rip_target(t, CHILD_STUB + 7, place) == g.table + 2 * ENTRY_SIZE
    assert _rip_target(t, CHILD_STUB + 14, place) == place + CODE_AT + _code.REARM
    # (no route to interpose: the block without its interposition part)
    assert t[CODE_AT: CODE_AT + _code.BASE_END] == _code.CODE[:_code.BASE_END]
    # the table: PC-relative site addresses and the sites' own bytes
    for i, (addr, raw) in enumerate(sites):
        entry = g.table + i * ENTRY_SIZE
        e = t[entry - place: entry - place + ENTRY_SIZE]
        assert entry + struct.unpack_from("<i", e)[0] == addr
        assert e[4:9] == raw and e[9:] == b"\0\0\0"
    # the relocation that fills DT_INIT_ARRAY[0] now points at the init stub, which chains
    # to the old target
    out = parse_elf(_apply(image, g.patches))
    (off, new), *rest = g.patches
    assert struct.unpack("<Q", new)[0] == place + INIT_STUB
    old = struct.unpack_from("<q", image.data, off)[0]
    stub = t[INIT_STUB:]
    jmp = stub.index(bytes([0x5A, 0x5E, 0x5F])) + 3  # pop rdx; pop rsi; pop rdi; jmp
    assert _rip_target(t, INIT_STUB + jmp, place) == old
    assert out.data != image.data and len(out.data) == len(image.data)
    assert all(o == off or struct.unpack_from("<Q", image.data, o)[0] in (0, old)
               for o, _ in rest)


def test_non_pie_hooks_the_pointer() -> None:
    image = _image(fixture("nopie"))
    place = _place(image)
    g = build_guard(image, ((place + 0x800, NOP5),), place)
    assert "the pointer at" in g.hook
    (off, new), = g.patches
    sec = image.section(".init_array")
    assert sec is not None and off == sec.offset
    assert struct.unpack("<Q", new)[0] == place + INIT_STUB


def test_shared_object_passes_its_dso_handle() -> None:
    """So that glibc drops the handler when the library is unloaded (dlclose)."""
    image = _image(fixture("libprobes.so"))
    place = _place(image)
    g = build_guard(image, ((place + 0x800, NOP5),), place)
    stub = g.text[INIT_STUB:CODE_AT]
    # push x3; mov %rdx,%rdi; lea child,%rsi; lea dso,%rdx; call register
    assert stub[:6] == bytes([0x57, 0x56, 0x52, 0x48, 0x89, 0xD7])
    assert _rip_target(g.text, INIT_STUB + 6, place) == place + CHILD_STUB
    dso = _rip_target(g.text, INIT_STUB + 13, place)
    assert g.text[INIT_STUB + 13: INIT_STUB + 16] == bytes([0x48, 0x8D, 0x15])
    # __dso_handle holds its own address (crtbeginS.o)
    rel = [r for r in _relatives(image) if r == (dso, dso)]
    assert rel, f"{dso:#x} is not a self-pointer"
    assert _rip_target(g.text, INIT_STUB + 20, place) == place + CODE_AT + _code.REGISTER


def _relatives(image: ElfImage) -> list[tuple[int, int]]:
    from usdtpatch.elf.relocs import relative_relocations

    return list(relative_relocations(image).items())


@pytest.mark.parametrize("name", ["i386", "aarch64", "bigendian"])
def test_refuses_other_machines(name: str) -> None:
    with pytest.raises(GuardUnsupported, match="x86-64"):
        build_guard(_image(fixture(name)), ((0x10000, NOP5),), 0x10000)


def test_a_static_file_without_register_atfork_is_hooked() -> None:
    """No __register_atfork to register with: the guard hooks the system call whose number
    the code does not fix (its C library's), the number compared at run time; a static file
    whose system call cannot be hooked is refused (tests/test_fork_static.py)."""
    image = _image(fixture("static"))
    g = build_guard(image, ((_place(image) + 0x800, NOP5),), _place(image))
    assert "hooked" in g.hook and "compare their number" in g.hook, g.hook
    assert len(g.patches) == 1 and g.patches[0][1][:1] == b"\xe9"


def test_refuses_an_init_array_filled_by_a_symbolic_relocation() -> None:
    image = _image(fixture("pie"))
    data = bytearray(image.data)
    dyn = {t: v for t, v, _o in forkguard._dynamic(image)}
    for off, r_offset, rtype, _add in forkguard._relas(image, dyn):
        if r_offset == dyn[model.DT_INIT_ARRAY]:
            assert rtype == model.R_X86_64_RELATIVE
            struct.pack_into("<Q", data, off + 8, (5 << 32) | 1)  # R_X86_64_64 against sym 5
    with pytest.raises(GuardUnsupported, match="relocation type 1"):
        build_guard(parse_elf(bytes(data)), ((0x10000, NOP5),), 0x10000)


def test_check_the_kernel_never_optimizes_need_no_guard() -> None:
    image = _image(fixture("pie"))
    place = _place(image)
    g = build_guard(image, ((place + 0x800, COMBO10), (place + 0xFFE, NOP5),
                            (place + 0x900, bytes([0x0F, 0x1F, 0x48, 0, 0]))), place)
    assert g.empty and g.patches == () and g.sites == ()  # combo10, page-crossing, hint nop


def test_refuses_an_unaligned_place() -> None:
    image = _image(fixture("pie"))
    with pytest.raises(GuardUnsupported, match="aligned"):
        build_guard(image, ((_place(image) + 0x800, NOP5),), _place(image) + 4)


# --- rewrite, check, restore ------------------------------------------------------------------

def _codes(path: Path) -> set[str]:
    return {f.code for f in check(path).findings}


def test_rewrite_guards_a_forking_program_and_check_says_so(tmp_path: Path) -> None:
    src = fixture("pie")
    out = tmp_path / "pie-always"
    outcome = rewrite(src, out, fork_guard="always")
    assert outcome.changed and not outcome.failed
    image = _image(out)
    cov = coverage(image)
    assert cov is not None and cov.kind == "rewrite"
    assert "fork-guarded" in _codes(out) and "process-can-fork" not in _codes(out)
    # every optimizable site of the output is in the table
    from usdtpatch.analysis.check import OPTIMIZABLE
    from usdtpatch.analysis.check import check as check_sites
    from usdtpatch.analysis.probes import read_probes

    rep = check_sites(read_probes(image))
    assert {s.probe.address for s in rep.sites if s.outcome == OPTIMIZABLE} <= cov.sites
    back = tmp_path / "pie-back"
    restore(out, back)
    assert back.read_bytes() == src.read_bytes()


def test_auto_leaves_a_program_that_cannot_fork_alone(tmp_path: Path) -> None:
    out = tmp_path / "pie"
    rewrite(fixture("pie"), out)
    assert coverage(_image(out)) is None
    always = tmp_path / "pie-always"
    rewrite(fixture("pie"), always, fork_guard="always")
    assert coverage(_image(always)) is not None


def test_auto_guards_a_shared_object(tmp_path: Path) -> None:
    out = tmp_path / "libprobes.so"
    rewrite(fixture("libprobes.so"), out)
    cov = coverage(_image(out))
    assert cov is not None and len(cov.sites) == 2
    assert "fork-guarded" in _codes(out)
    never = tmp_path / "libprobes-never.so"
    rewrite(fixture("libprobes.so"), never, fork_guard="never")
    assert coverage(_image(never)) is None


def test_an_executable_is_exposed_by_the_libraries_it_loads() -> None:
    """A dynamically linked executable that names no fork may fork through a library it
    needs (other than the C library's and the compiler's own): `auto` guards it."""
    assert forkguard.fork_exposure(_image(fixture("pie"))) is None  # libc only
    why = forkguard.fork_exposure(_image(fixture("uses-shared")))
    assert why is not None and "libprobes.so" in why
    assert forkguard.fork_exposure(_image(fixture("cxx-throw"))) is None  # libstdc++, libgcc_s


def test_needed_names_out_of_the_string_table_read_as_unknown() -> None:
    """A DT_NEEDED whose offset lies past DT_STRSZ reads as "?" (a library that may fork),
    never as another string or an error."""
    image = _image(fixture("uses-shared"))
    data = bytearray(image.data)
    entry = next(o for t, _v, o in dynamic_entries(image) if t == DT_NEEDED)
    struct.pack_into("<Q", data, entry + 8, 1 << 40)
    names = needed_objects(parse_elf(bytes(data)))
    assert names[0] == "?" and "libc.so.6" in names
    assert forkguard.fork_exposure(parse_elf(bytes(data))) is not None


def _without_init_hooks(data: bytes) -> bytes:
    """The file with its DT_INIT, DT_INIT_ARRAY(SZ) entries turned into an ignored tag."""
    image = parse_elf(data)
    out = bytearray(data)
    for tag, _v, off in forkguard._dynamic(image):
        if tag in (model.DT_INIT, model.DT_INIT_ARRAY, model.DT_INIT_ARRAYSZ):
            struct.pack_into("<q", out, off, 0x6FFFFDFF)  # DT_CHECKSUM's neighbour: ignored
    return bytes(out)


def test_no_hook_without_init_array_or_init() -> None:
    image = parse_elf(_without_init_hooks(fixture("pie").read_bytes()))
    with pytest.raises(GuardUnsupported, match="neither DT_INIT_ARRAY nor DT_INIT"):
        build_guard(image, ((0x10000, NOP5),), 0x10000)


@pytest.fixture(scope="module")
def forking(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The server fixture with systemtap's 1-byte sites (it calls fork): PIE, and the same
    without an init hook (a file the guard cannot cover)."""
    need_cc()
    d = tmp_path_factory.mktemp("forking")
    out = {"pie": d / "server", "unhookable": d / "server-unhookable"}
    cc(["-O2", "-fPIE", "-pie", str(SRC / "forkserver.c"), "-o", str(out["pie"])])
    out["unhookable"].write_bytes(_without_init_hooks(out["pie"].read_bytes()))
    return out


@pytest.mark.needs_cc
def test_never_leaves_the_hazard_and_check_reports_it(forking: dict[str, Path],
                                                     tmp_path: Path) -> None:
    out = tmp_path / "never"
    rewrite(forking["pie"], out, fork_guard="never")
    assert "process-can-fork" in _codes(out) and "fork-guarded" not in _codes(out)
    guarded = tmp_path / "auto"
    rewrite(forking["pie"], guarded)
    assert "fork-guarded" in _codes(guarded) and "process-can-fork" not in _codes(guarded)


@pytest.mark.needs_cc
def test_rewrite_refuses_an_unguardable_forking_program(forking: dict[str, Path],
                                                        tmp_path: Path) -> None:
    src = forking["unhookable"]
    assert "fork-guard-unavailable" in _codes(src)
    assert "fork-guard-unavailable" not in _codes(forking["pie"])
    out = tmp_path / "out"
    with pytest.raises(UnsupportedError, match=r"fork guard cannot be added.*--fork-guard never"):
        rewrite(src, out)
    assert not out.exists()
    rewrite(src, out, fork_guard="never")
    assert out.exists() and "process-can-fork" in _codes(out)


@pytest.mark.needs_cc
def test_rewrite_cli_refusal_is_one_line(forking: dict[str, Path], tmp_path: Path) -> None:
    from tests.helpers import run_cli

    res = run_cli("rewrite", str(forking["unhookable"]), "-o", str(tmp_path / "o"))
    assert res.rc == 2
    assert "fork guard cannot be added" in res.err and "Traceback" not in res.err
    assert len(res.err.strip().splitlines()) == 1


# --- sys/sdt.h's guard, as built --------------------------------------------------------------

TU_A = r"""
#include <sys/sdt.h>
void a1(long x) { STAP_PROBE1(tu, a1, x); }
void a2(long x) { STAP_PROBE1(tu, a2, x); }
"""
TU_B = r"""
#include <sys/sdt.h>
void a1(long); void a2(long);
void b1(long x) { STAP_PROBE1(tu, b1, x); }
int main(int argc, char **argv) { (void)argv; a1(argc); a2(argc); b1(argc); return 0; }
"""


def _build_two(tmp: Path, *flags: str, shared: bool = False) -> Path:
    (tmp / "a.c").write_text(TU_A)
    (tmp / "b.c").write_text(TU_B)
    out = tmp / ("lib.so" if shared else "prog")
    extra = ["-fPIC", "-shared"] if shared else []
    cc(["-O2", f"-I{SDT_INCLUDE}", *flags, *extra, str(tmp / "a.c"), str(tmp / "b.c"),
        "-o", str(out)])
    return out


def _init_array(image: ElfImage) -> list[int]:
    from usdtpatch.elf.relocs import relative_relocations

    sec = image.section(".init_array")
    assert sec is not None
    rel = relative_relocations(image)
    return [rel.get(sec.addr + i, struct.unpack_from("<Q", image.data, sec.offset + i)[0])
            for i in range(0, sec.size, 8)]


def _symbol(image: ElfImage, name: str) -> int:
    value = forkguard._symbol(image, name)
    assert value is not None, name
    return value


@pytest.mark.needs_cc
@pytest.mark.parametrize("shared", [False, True], ids=["exe", "shared"])
def test_header_one_handler_per_object(tmp_path: Path, shared: bool) -> None:
    out = _build_two(tmp_path, shared=shared)
    image = _image(out)
    table = header_table(image)
    assert table is not None
    probes = {p.address for p in load(out).probes}
    assert {e.site for e in table} == probes and len(table) == 3
    assert all(e.orig == NOP5 for e in table)
    init = _symbol(image, "__usdtpatch_fork_init")
    assert _init_array(image).count(init) == 1  # one registration, two translation units
    dyn = subprocess.run(["readelf", "--dyn-syms", "-W", str(out)], capture_output=True,
                         text=True, check=True).stdout
    assert "usdtpatch" not in dyn  # hidden: nothing exported, nothing interposed
    # the embedded code is the committed code
    rearm = _symbol(image, "__usdtpatch_fork_rearm")
    assert image.read_vaddr(rearm, _code.REARM_END) == _code.CODE[:_code.REARM_END]
    cov = coverage(image)
    assert cov is not None and cov.kind == "sdt.h"


@pytest.mark.needs_cc
@pytest.mark.parametrize(("flags", "guarded", "shift"), [
    ([], True, 0),
    (["-DUSDTPATCH_SITE_FORM=combo5"], True, 1),
    (["-DUSDTPATCH_REDZONE_GUARD"], True, 0),
    (["-DUSDTPATCH_FORK_GUARD=0"], False, 0),
    (["-DUSDTPATCH_SITE_FORM=nop1"], False, 0),
    (["-DUSDTPATCH_SITE_FORM=combo10"], False, 0),
    (["-DUSDTPATCH_SITE_FORM=combo10", "-DUSDTPATCH_FORK_GUARD=1"], False, 0),
], ids=["nop5", "combo5", "redzone", "off", "nop1", "combo10", "combo10-asked"])
def test_header_guard_by_form(tmp_path: Path, flags: list[str], guarded: bool,
                              shift: int) -> None:
    out = _build_two(tmp_path, *flags)
    image = _image(out)
    table = header_table(image)
    if not guarded:
        assert table is None and forkguard._symbol(image, "__usdtpatch_fork_init") is None
        return
    assert table is not None
    probes = {p.address + shift for p in load(out).probes}
    assert {e.site for e in table} == probes
    assert all(image.read_vaddr(e.site, 5) == NOP5 for e in table)
    codes = _codes(out)
    assert "fork-guarded" in codes and "process-can-fork" not in codes


@pytest.mark.needs_cc
@pytest.mark.parametrize("cc_name", ["gcc", "clang"])
def test_header_table_survives_section_gc(tmp_path: Path, cc_name: str) -> None:
    """-ffunction-sections --gc-sections, also with -z start-stop-gc (a linker that does not
    keep a section for its __start_ reference): each entry lives and dies with the code of
    its site (SHF_LINK_ORDER)."""
    if not shutil.which(cc_name):
        pytest.skip(f"{cc_name} is not installed")
    (tmp_path / "a.c").write_text(TU_A + "void unused(long x) { STAP_PROBE1(tu, unused, x); }\n")
    (tmp_path / "b.c").write_text(TU_B)
    out = tmp_path / "gc"
    proc = subprocess.run([cc_name, "-O2", f"-I{SDT_INCLUDE}", "-ffunction-sections",
                           "-Wl,--gc-sections", "-Wl,-z,start-stop-gc", str(tmp_path / "a.c"),
                           str(tmp_path / "b.c"), "-o", str(out)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0 and "start-stop-gc" in proc.stderr:
        pytest.skip("the linker has no -z start-stop-gc")
    assert proc.returncode == 0, proc.stderr
    image = _image(out)
    table = header_table(image)
    assert table is not None
    sites = {e.site for e in table}
    live = {p.name: p.address for p in load(out).probes}
    assert {live["a1"], live["a2"], live["b1"]} <= sites  # the kept code's sites, all
    assert all(image.read_vaddr(a, 5) == NOP5 for a in sites)  # no entry into dropped code
    if "unused" not in live or forkguard._symbol(image, "unused") is None:
        assert len(sites) == 3


@pytest.mark.needs_cc
def test_header_table_of_an_object_file_needs_no_dynamic_relocation(tmp_path: Path) -> None:
    """The entries are link-time PC-relative: a PIE or shared object gets no relocation for
    them."""
    out = _build_two(tmp_path, shared=True)
    image = _image(out)
    sec = image.section(forkguard.TABLE_SECTION)
    assert sec is not None
    from usdtpatch.elf.relocs import relative_relocations

    assert not [r for r in relative_relocations(image) if sec.addr <= r < sec.addr + sec.size]


# --- nothing on the probe's path ------------------------------------------------------------

def _function_bytes(path: Path, name: str) -> bytes:
    image = _image(path)
    from usdtpatch.elf.symbols import load_symbols

    syms = load_symbols(image)
    for i, addr in enumerate(syms.addresses):
        if syms.name_at(i) == name:
            return image.read_vaddr(addr, syms.sizes[i])
    raise AssertionError(f"{path}: no function {name}")


@pytest.mark.needs_cc
def test_the_guard_adds_nothing_to_the_probes_path(tmp_path: Path,
                                                   forking: dict[str, Path]) -> None:
    """The probed function is the same code with and without the guard (header-built), and a
    rewritten file's sites and detours are the same bytes with and without it: the guard only
    runs at load time and in a forked child (bench/bench_fork.py measures both)."""
    builds = {}
    for g in ("1", "0"):
        builds[g] = tmp_path / f"h{g}"
        cc(["-O2", f"-I{SDT_INCLUDE}", f"-DUSDTPATCH_FORK_GUARD={g}", str(SRC / "forkserver.c"),
            "-o", str(builds[g])])
    assert _function_bytes(builds["1"], "forksrv_hit") == _function_bytes(builds["0"],
                                                                          "forksrv_hit")
    outs = {}
    for g in ("auto", "never"):
        outs[g] = tmp_path / f"rw-{g}"
        rewrite(forking["pie"], outs[g], fork_guard=g)
    a, b = _image(outs["auto"]), _image(outs["never"])
    assert _function_bytes(outs["auto"], "forksrv_hit") == _function_bytes(outs["never"],
                                                                           "forksrv_hit")
    sec_a, sec_b = a.section(".usdtpatch.text"), b.section(".usdtpatch.text")
    assert sec_a is not None and sec_b is not None and sec_a.addr == sec_b.addr
    detours = a.section_data(sec_a)[: sec_b.size]
    assert detours.rstrip(b"\xcc") == b.section_data(sec_b).rstrip(b"\xcc")
    assert sec_a.size > sec_b.size  # the guard comes after the detours


@pytest.mark.parametrize(("name", "expected"), [
    ("fork", "it calls fork"),
    ("nofork", None),
    ("pie", None),
    ("libprobes.so", "it is a shared object (the process that loads it may fork)"),
    # its C library's system call of a number the code does not fix: it may fork (hooked)
    ("static", "it may fork: a syscall whose number is not a constant set before it at 0x"),
])
def test_fork_exposure(name: str, expected: str | None) -> None:
    got = forkguard.fork_exposure(_image(fixture(name)))
    assert got == expected or (got is not None and expected is not None
                               and expected.endswith("0x") and got.startswith(expected))


def test_restore_undoes_the_guard_of_a_shared_object(tmp_path: Path) -> None:
    out = tmp_path / "libprobes.so"
    rewrite(fixture("libprobes.so"), out)
    assert coverage(_image(out)) is not None
    back = tmp_path / "back.so"
    restore(out, back)
    assert back.read_bytes() == fixture("libprobes.so").read_bytes()


@pytest.mark.needs_cc
def test_relr_init_array_patches_the_word(tmp_path: Path) -> None:
    out = tmp_path / "relr"
    try:
        cc(["-O2", "-fPIE", "-pie", "-Wl,-z,pack-relative-relocs", str(SRC / "forkserver.c"),
            "-o", str(out)])
    except AssertionError:
        pytest.skip("the linker has no -z pack-relative-relocs")
    image = _image(out)
    place = _place(image)
    g = build_guard(image, ((place + 0x800, NOP5),), place)
    assert "DT_RELR" in g.hook
    (off, new), = g.patches
    sec = image.section(".init_array")
    assert sec is not None and off == sec.offset
    assert struct.unpack("<Q", new)[0] == place + INIT_STUB


def test_guard_only_rewrite_of_a_forking_nop5_file(tmp_path: Path) -> None:
    """fixtures/bin/fork (nop5 already, calls fork): only the guard is added; `never` and a
    file that cannot fork (nofork) are copied unchanged; restore gives the original."""
    out = tmp_path / "fork"
    outcome = rewrite(fixture("fork"), out)
    assert outcome.changed and outcome.findings
    cov = coverage(_image(out))
    assert cov is not None and len(cov.sites) == 1
    assert "fork-guarded" in _codes(out) and "process-can-fork" not in _codes(out)
    back = tmp_path / "back"
    restore(out, back)
    assert back.read_bytes() == fixture("fork").read_bytes()
    never = tmp_path / "never"
    assert not rewrite(fixture("fork"), never, fork_guard="never").changed
    assert not rewrite(fixture("nofork"), tmp_path / "nofork").changed
    assert rewrite(fixture("nofork"), tmp_path / "nofork-always", fork_guard="always").changed
