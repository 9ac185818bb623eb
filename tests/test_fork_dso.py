"""`__dso_handle` of stripped shared objects (usdtpatch/forkguard/dso.py): the fork guard of
a rewritten shared object passes it to `__register_atfork` so that glibc drops the handler
when the object is unloaded; a stripped object has no symbol for it, and the word is read
from the code that passes it to `__cxa_finalize` / `__cxa_atexit`.

- real stripped libraries of the machine (libruby, libstdc++, libpython3.11, the libvirt
  files under build/cache): the answer is a word relocated to point at itself and every
  witness names it; libjvm (which has a .symtab) stripped into a copy gives its symbol's value;
- shared objects built here by gcc, clang and clang with compiler-rt's crtbegin, C and C++,
  each with decoy self-pointing words: the stripped copy's answer equals the unstripped
  copy's `__dso_handle` symbol;
- refusals: no witness (no crtbegin), witnesses that disagree, a witness naming a word that
  does not point at itself;
- the handle at work: a rewritten stripped library is dlopen'ed, dlclose'd, and the process
  forks: the child must not run the unloaded object's handler (with the handle pointed at
  another self-pointing word it does, and dies with SIGSEGV);
- live (6.18): ruby with the rewritten libruby (LD_LIBRARY_PATH) forks while
  ruby:gc__mark__begin is traced: the child survives and its hits are counted; with
  `--fork-guard never` it dies with SIGSEGV.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_fork_support import run_under_uprobes
from usdtpatch.analysis.check import check
from usdtpatch.api import load, rewrite
from usdtpatch.elf.image import ElfImage, parse_elf
from usdtpatch.elf.relocs import RelaTable, import_slots, relative_relocations
from usdtpatch.elf.symbols import symbol_indices, symbol_value
from usdtpatch.forkguard import GuardUnsupported, _dynamic, _relas, build_guard, hook_problem
from usdtpatch.forkguard.dso import find_dso_handle
from usdtpatch.x86.nops import NOP5

ROOT = Path(__file__).resolve().parent.parent
LIB = Path("/usr/lib/x86_64-linux-gnu")
CACHE = ROOT / "build" / "cache"
REAL = {
    "libruby": LIB / "libruby-3.1.so.3.1.2",
    "libstdc++": LIB / "libstdc++.so.6",
    "libpython3.11": LIB / "libpython3.11.so.1.0",
}
REAL.update({p.name: p for p in sorted(CACHE.glob("*/root/usr/lib/x86_64-linux-gnu/*.so*"))
             if p.is_file() and not p.is_symlink()})
LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")
RUBY = Path("/usr/bin/ruby")


def _image(path: Path) -> ElfImage:
    return parse_elf(path.read_bytes())


def _answer(image: ElfImage) -> tuple[int | None, str, list[str]]:
    dyn = {t: v for t, v, _o in _dynamic(image)}
    found = find_dso_handle(image, dyn, _relas(image, dyn))
    return found.address, found.reason, sorted({w.what for w in found.witnesses})


def _self_pointing(image: ElfImage) -> set[int]:
    return {place for place, addend in relative_relocations(image).items() if place == addend}


# --- the ELF readers it uses ----------------------------------------------------------------

def _pyelftools_slots(path: Path, name: str) -> list[int]:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection
    from elftools.elf.sections import SymbolTableSection

    out = []
    with path.open("rb") as f:
        elf = ELFFile(f)
        for sec in elf.iter_sections():
            if not isinstance(sec, RelocationSection):
                continue
            symtab = elf.get_section(sec["sh_link"])
            if not isinstance(symtab, SymbolTableSection) or symtab.name != ".dynsym":
                continue
            for r in sec.iter_relocations():
                if r["r_info_type"] in (1, 6, 7) and \
                        symtab.get_symbol(r["r_info_sym"]).name == name:
                    out.append(r["r_offset"])
    return sorted(out)


@pytest.mark.parametrize("name", ["libruby", "libstdc++"])
def test_import_slots_agree_with_pyelftools(name: str) -> None:
    path = REAL[name]
    if not path.exists():
        pytest.skip(f"{path} is not installed")
    image = _image(path)
    for sym in ("__cxa_finalize", "__cxa_atexit", "malloc", "no_such_symbol"):
        assert import_slots(image, sym) == _pyelftools_slots(path, sym), sym
    assert import_slots(image, "__cxa_finalize")  # one GOT slot at least
    dynsym = image.section(".dynsym")
    assert dynsym is not None
    assert symbol_indices(image, dynsym, "no_such_symbol") == []
    assert len(symbol_indices(image, dynsym, "__cxa_finalize")) == 1


def test_rela_table_in_range_is_at_for_each_place() -> None:
    path = REAL["libruby"]
    if not path.exists():
        pytest.skip(f"{path} is not installed")
    image = _image(path)
    dyn = {t: v for t, v, _o in _dynamic(image)}
    relas: RelaTable = _relas(image, dyn)
    start = dyn[25]  # DT_INIT_ARRAY, then DT_FINI_ARRAY right after it
    got = relas.in_range(start - 64, start + 64)
    want = [(p, t, a) for p in range(start - 64, start + 64, 8) for _o, t, a in relas.at(p)]
    assert sorted(got) == sorted(want) and len(got) >= 2
    assert relas.in_range(1, 2) == []


# --- real stripped libraries ----------------------------------------------------------------

@pytest.mark.parametrize("name", list(REAL))
def test_real_stripped_library(name: str) -> None:
    path = REAL[name]
    if not path.exists():
        pytest.skip(f"{path} is not present")
    image = _image(path)
    assert image.section(".symtab") is None and symbol_value(image, "__dso_handle") is None
    address, reason, kinds = _answer(image)
    assert address is not None, reason
    assert "__cxa_finalize" in kinds  # crtstuff's __do_global_dtors_aux
    assert address in _self_pointing(image)
    assert hook_problem(image) is None
    if name == "libruby":
        # Kernel#syscall calls syscall() with a number not fixed in the code: a fork the
        # guard's atfork handler would not see, said (not refused: the guard covers fork())
        said = {f.code: f.message for f in check(load(str(path))).findings}
        assert "syscall()" in said.get("fork-unknown", ""), said


def test_libruby_has_several_self_pointing_words() -> None:
    """Why the word is read from the code: "the one self-pointing word" is not one here."""
    path = REAL["libruby"]
    if not path.exists():
        pytest.skip(f"{path} is not installed")
    assert len(_self_pointing(_image(path))) > 1


@pytest.mark.slow
def test_stripped_libjvm_gives_its_symbol(tmp_path: Path) -> None:
    if not LIBJVM.exists() or not shutil.which("strip"):
        pytest.skip("libjvm.so or strip is not installed")
    want = symbol_value(_image(LIBJVM), "__dso_handle")
    assert want is not None
    out = tmp_path / "libjvm.so"
    subprocess.run(["strip", "-o", str(out), str(LIBJVM)], check=True)
    stripped = _image(out)
    assert symbol_value(stripped, "__dso_handle") is None
    address, reason, kinds = _answer(stripped)
    assert address == want, reason
    assert kinds == ["__cxa_atexit", "__cxa_finalize"]


# --- objects built here ---------------------------------------------------------------------

C_SRC = r"""
#include <sys/sdt.h>
static void *decoy = &decoy;            /* more self-pointing words than __dso_handle */
void *other = &other;
long ready;
__attribute__((constructor)) static void start(void) { ready = 1; }  /* an init function */
__attribute__((noinline)) long dso_hit(long i)
{
    DTRACE_PROBE1(dso, hit, i);
    return i + ready + (decoy != 0);
}
"""

CXX_SRC = r"""
#include <string>
#include <sys/sdt.h>
static std::string keep("a string long enough to be on the heap, destroyed at unload");
static void *decoy = &decoy;
extern "C" __attribute__((noinline)) long dso_hit(long i)
{
    DTRACE_PROBE1(dso, hit, i);
    return (long)keep.size() + i + (decoy != 0);
}
"""

COMPILERS = {"gcc": (["gcc"], ["g++"]), "clang": (["clang"], ["clang++"]),
             "clang-compiler-rt": (["clang", "--rtlib=compiler-rt"],
                                   ["clang++", "--rtlib=compiler-rt"])}


def _build(tmp: Path, compiler: str, lang: str, extra: tuple[str, ...] = ()) -> Path:
    c, cxx = COMPILERS[compiler]
    argv = cxx if lang == "c++" else c
    if not shutil.which(argv[0]) or not shutil.which("strip"):
        pytest.skip(f"{argv[0]} or strip is not installed")
    src = tmp / ("lib.cpp" if lang == "c++" else "lib.c")
    src.write_text(CXX_SRC if lang == "c++" else C_SRC)
    out = tmp / f"lib-{compiler}-{lang}.so"
    proc = subprocess.run([*argv, "-O2", "-fPIC", "-shared", *extra, str(src), "-o", str(out)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        if compiler == "clang-compiler-rt":
            pytest.skip(f"clang cannot link with compiler-rt here: {proc.stderr[-300:]}")
        raise AssertionError(proc.stderr[-3000:])
    return out


def _strip(path: Path) -> Path:
    out = path.with_suffix(".stripped.so")
    subprocess.run(["strip", "-o", str(out), str(path)], check=True)
    return out


@pytest.mark.needs_cc
@pytest.mark.parametrize("lang", ["c", "c++"])
@pytest.mark.parametrize("compiler", list(COMPILERS))
def test_stripped_copy_gives_the_unstripped_symbol(tmp_path: Path, compiler: str,
                                                   lang: str) -> None:
    built = _build(tmp_path, compiler, lang)
    want = symbol_value(_image(built), "__dso_handle")
    assert want is not None
    stripped = _image(_strip(built))
    assert symbol_value(stripped, "__dso_handle") is None
    assert len(_self_pointing(stripped)) >= 2  # the decoy too
    address, reason, kinds = _answer(stripped)
    assert address == want, reason
    assert kinds == (["__cxa_atexit", "__cxa_finalize"] if lang == "c++"
                     else ["__cxa_finalize"])
    # and the guard's init stub passes it (lea dso(%rip),%rdx at INIT_STUB + 13)
    place = (max(s.vaddr + s.memsz for s in stripped.segments) + 0xFFFF) & ~0xFFFF
    g = build_guard(stripped, ((place + 0x800, NOP5),), place)
    (disp,) = struct.unpack_from("<i", g.text, 32 + 16)
    assert g.text[32 + 13: 32 + 16] == b"\x48\x8d\x15" and place + 32 + 20 + disp == want


def _patch_disp(data: bytearray, image: ElfImage, insn: int, target: int) -> None:
    """Point the rip-relative disp32 of the 7-byte instruction at vaddr `insn` at `target`."""
    off = image.vaddr_to_offset(insn)
    assert off is not None
    struct.pack_into("<i", data, off + 3, target - (insn + 7))


@pytest.mark.needs_cc
def test_refuses_witnesses_that_disagree(tmp_path: Path) -> None:
    stripped_path = _strip(_build(tmp_path, "gcc", "c++"))
    image = _image(stripped_path)
    dyn = {t: v for t, v, _o in _dynamic(image)}
    found = find_dso_handle(image, dyn, _relas(image, dyn))
    assert found.address is not None
    fin = next(w for w in found.witnesses if w.what == "__cxa_finalize")
    decoy = min(_self_pointing(image) - {found.address})
    data = bytearray(image.data)
    # the mov __dso_handle(%rip),%rdi right before the call
    load = fin.call - 7
    assert data[image.vaddr_to_offset(load) or 0:][:3] == b"\x48\x8b\x3d"
    _patch_disp(data, image, load, decoy)
    bad = parse_elf(bytes(data))
    address, reason, _kinds = _answer(bad)
    assert address is None
    assert "different words" in reason and f"{decoy:#x}" in reason
    assert f"{found.address:#x}" in reason
    with pytest.raises(GuardUnsupported, match="shared object without a __dso_handle"):
        build_guard(bad, ((0x100000, NOP5),), 0x100000)
    assert hook_problem(bad) is not None


@pytest.mark.needs_cc
def test_refuses_a_witness_that_is_not_self_pointing(tmp_path: Path) -> None:
    image = _image(_strip(_build(tmp_path, "gcc", "c")))
    dyn = {t: v for t, v, _o in _dynamic(image)}
    found = find_dso_handle(image, dyn, _relas(image, dyn))
    assert found.address is not None
    (fin,) = found.witnesses
    data = bytearray(image.data)
    dynamic = next(s for s in image.segments if s.type == 2)  # a word of .dynamic
    _patch_disp(data, image, fin.call - 7, dynamic.vaddr + 8)
    address, reason, _kinds = _answer(parse_elf(bytes(data)))
    assert address is None and "does not point at itself" in reason


@pytest.mark.needs_cc
def test_refuses_an_object_without_witness(tmp_path: Path) -> None:
    """No crtbeginS.o: no __cxa_finalize call, no __dso_handle, and self-pointing words that
    must not be taken for it."""
    built = _build(tmp_path, "gcc", "c", ("-nostartfiles",))
    assert symbol_value(_image(built), "__dso_handle") is None
    image = _image(_strip(built))
    assert _self_pointing(image)
    address, reason, kinds = _answer(image)
    assert address is None and kinds == []
    assert "no code passes it to __cxa_finalize" in reason
    problem = hook_problem(image)
    assert problem is not None and "no code passes it" in problem


# --- the handle at work: dlclose drops the handler -----------------------------------------

DLCLOSE_SCRIPT = r"""
import ctypes, os, sys, _ctypes
lib = ctypes.CDLL(sys.argv[1])
assert lib.dso_hit(1) > 0
_ctypes.dlclose(lib._handle)
maps = open("/proc/self/maps").read()
assert sys.argv[1] not in maps, "still mapped"
pid = os.fork()  # a handler left registered would jump into the unmapped object here
if pid == 0:
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.needs_cc
@pytest.mark.parametrize("lang", ["c", "c++"])
def test_dlclose_drops_the_guard_of_a_stripped_library(tmp_path: Path, lang: str) -> None:
    stripped = _strip(_build(tmp_path, "gcc", lang))
    out = tmp_path / "rewritten.so"
    outcome = rewrite(stripped, out, fork_guard="always")
    assert outcome.changed and not outcome.failed
    assert _dlclose_then_fork(out) == "child 0"
    # the same library registering with another self-pointing word (the decoy): glibc keeps
    # the handler after dlclose, and the forked child jumps into the unmapped object
    image = _image(out)
    init = symbol_value(image, "__usdtpatch_fork_init")
    assert init is not None
    data = bytearray(image.data)
    lea = init + 13  # push x3; mov %rdx,%rdi; lea child,%rsi; lea dso(%rip),%rdx
    assert data[(image.vaddr_to_offset(lea) or 0):][:3] == b"\x48\x8d\x15"
    (disp,) = struct.unpack_from("<i", data, (image.vaddr_to_offset(lea) or 0) + 3)
    decoy = min(_self_pointing(image) - {lea + 7 + disp})
    _patch_disp(data, image, lea, decoy)
    wrong = tmp_path / "wrong.so"
    wrong.write_bytes(bytes(data))
    assert _dlclose_then_fork(wrong) == f"child {-signal.SIGSEGV}"


def _dlclose_then_fork(lib: Path) -> str:
    run = subprocess.run([sys.executable, "-c", DLCLOSE_SCRIPT, str(lib)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


# --- live: ruby forks with the rewritten libruby ------------------------------------------

RUBY_SCRIPT = r"""
3.times { GC.start }
$stdout.puts "ready"; $stdout.flush
$stdin.gets
pid = fork do
  CHILD_GCS.times { GC.start }
  exit!(File.read("/proc/self/maps").include?("[uprobes-trampoline]") ? 0 : 3)
end
Process.wait(pid)
st = $?
$stdout.puts "child #{st.signaled? ? -st.termsig : st.exitstatus}"; $stdout.flush
$stdin.gets
"""
CHILD_GCS = 5


@pytest.fixture(scope="module")
def rubies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    lib = REAL["libruby"]
    if not lib.exists() or not RUBY.exists():
        pytest.skip("ruby or libruby3.1 is not installed")
    out = {}
    for guard in ("auto", "never"):
        d = tmp_path_factory.mktemp(f"ruby-{guard}")
        o = rewrite(lib, d / "libruby-3.1.so.3.1", fork_guard=guard)
        assert o.changed and not o.failed
        out[guard] = d / "libruby-3.1.so.3.1"
    return out


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize(("guard", "survives"), [("auto", True), ("never", False)],
                         ids=["guarded", "unguarded"])
def test_ruby_forks_with_the_rewritten_libruby(rubies: dict[str, Path], guard: str,
                                               survives: bool) -> None:
    lib = rubies[guard]
    probe = next(p for p in load(str(lib)).probes if p.name == "gc__mark__begin")
    assert probe.offset is not None
    sem = probe.semaphore.offset if probe.semaphore is not None and probe.semaphore.offset \
        else 0
    # the site is optimized in the parent before the fork (run_under_uprobes checks it)
    run = run_under_uprobes([str(RUBY), "-e", RUBY_SCRIPT.replace("CHILD_GCS", str(CHILD_GCS))],
                            [(lib, probe.offset, sem)], last="\n", timeout=60,
                            env={**os.environ, "LD_LIBRARY_PATH": str(lib.parent)})
    assert run.before >= 3
    if survives:
        assert run.line == "child 0"
        assert run.after == CHILD_GCS  # the child's own hits, counted
    else:
        assert run.line == f"child {-signal.SIGSEGV}"
        assert run.after == 0
