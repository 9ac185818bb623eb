"""fork() in the emulator (usdtpatch.verification.fork): the child of a process whose sites are
optimized, with and without the fork guard, running the guard's committed machine code under
unicorn. The same outcomes as on the real kernel (test_fork_header.py,
test_fork_rewrite_live.py): without the guard the child dies with SIGSEGV at the trampoline
address at its first hit; with it every site is back in the int3 state and a hit takes the
int3 path. And `verify` reports it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.helpers import fixture
from tests.test_fork_support import SDT_INCLUDE, SRC, cc, need_cc
from usdtpatch import forkguard
from usdtpatch.api import rewrite, verify
from usdtpatch.elf.image import ElfImage, parse_elf
from usdtpatch.verification.fork import describe, fork_findings, model_fork
from usdtpatch.x86.nops import NOP5

pytestmark = pytest.mark.needs_cc


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    need_cc()
    d = tmp_path_factory.mktemp("fork-emulate")
    out = {}
    for name, flags in (("header", []), ("header-off", ["-DUSDTPATCH_FORK_GUARD=0"]),
                        ("header-combo5", ["-DUSDTPATCH_SITE_FORM=combo5"])):
        out[name] = d / name
        cc(["-O2", f"-I{SDT_INCLUDE}", *flags, str(SRC / "forkserver.c"), "-o",
            str(out[name])])
    stap = d / "stap"
    cc(["-O2", "-no-pie", "-fno-pie", str(SRC / "forkserver.c"), "-o", str(stap)])
    for g in ("auto", "never"):
        out[f"rewrite-{g}"] = d / f"rewrite-{g}"
        rewrite(stap, out[f"rewrite-{g}"], fork_guard=g)
    return out


def _image(p: Path) -> ElfImage:
    return parse_elf(p.read_bytes())


@pytest.mark.parametrize("name", ["header", "header-combo5", "rewrite-auto"])
def test_guarded_child_rearms_and_survives(files: dict[str, Path], name: str) -> None:
    m = model_fork(_image(files[name]))
    assert m.guard is not None and m.fault is None and m.sites
    for s in m.sites:
        assert s.after_fork[0] == 0xE8  # inherited: a call into the missing page
        assert s.after_handlers == b"\xcc" + NOP5[1:]  # the kernel's int3 state
        assert s.hit == "int3"
    assert m.child_survives
    assert any(c.startswith("pwrite64(") for c in m.syscalls)
    assert "re-armed" in describe(m)


@pytest.mark.parametrize("name", ["header-off", "rewrite-never"])
def test_unguarded_child_dies_at_the_trampoline_address(files: dict[str, Path],
                                                       name: str) -> None:
    m = model_fork(_image(files[name]))
    assert m.guard is None and m.sites and m.trampoline is not None
    for s in m.sites:
        assert s.after_handlers == s.after_fork
        assert s.hit == f"SIGSEGV at {m.trampoline:#x}"
    assert not m.child_survives


def test_a_guarded_file_whose_handler_does_not_run(files: dict[str, Path]) -> None:
    m = model_fork(_image(files["header"]), guard=False)
    assert not m.child_survives and m.syscalls == ()


def test_without_proc_the_handler_uses_mprotect_and_leaves_no_page_writable(
        files: dict[str, Path]) -> None:
    m = model_fork(_image(files["rewrite-auto"]), proc=False)
    assert m.child_survives
    prots = [c for c in m.syscalls if c.startswith("mprotect(")]
    assert prots and prots[-1].endswith(", 5) = 0")  # back to r-x
    assert all(", 7) = 0" in a and ", 5) = 0" in b for a, b in zip(prots[::2], prots[1::2],
                                                                  strict=True))


def test_a_corrupted_table_entry_is_caught(files: dict[str, Path], tmp_path: Path) -> None:
    """The entry of the only site points 16 bytes off: the child still dies, and verify says
    the guard failed (an error)."""
    img = _image(files["header"])
    sec = img.section(forkguard.TABLE_SECTION)
    assert sec is not None
    data = bytearray(img.data)
    for off in range(sec.offset, sec.offset + sec.size, forkguard.ENTRY_SIZE):
        rel = struct.unpack_from("<i", data, off)[0]
        if rel:
            struct.pack_into("<i", data, off, rel + 16)
    bad = tmp_path / "bad"
    bad.write_bytes(bytes(data))
    m = model_fork(_image(bad), tuple(e.site for e in forkguard.header_table(img) or ()))
    assert not m.child_survives
    codes = {f.code for f in verify(bad).findings}
    assert "fork-guard-failed" in codes and not verify(bad).ok


def test_verification_reports_fork(files: dict[str, Path]) -> None:
    assert "fork-guarded" in {f.code for f in verify(files["rewrite-auto"]).findings}
    never = verify(files["rewrite-never"])
    assert "process-can-fork" in {f.code for f in never.findings} and never.ok
    # a file that cannot fork and has no guard: nothing about fork
    assert not fork_findings(_image(fixture("nop5")), (0x1130,))
    assert fork_findings(_image(fixture("nop5")), ()) == ()
