"""Re-laid windows (issue 22, "In-place re-laying"; docs/rewrite.md, "Re-laid in place"): a
site whose following instructions re-encode shorter gets the new site at its pc in the same
bytes. The sequence gas pads for the linker (a general-dynamic TLS access of a -fPIC shared
object) is re-laid, rewritten and run; the rules refuse a way in inside, an unwind row or a
return address that would move; the verifiers reject a mutated re-laid encoding."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import started
from tests.helpers import ROOT, run_cli
from usdtpatch import api
from usdtpatch.analysis.check import SiteCheck
from usdtpatch.analysis.windows import WindowShape
from usdtpatch.elf.image import parse_elf
from usdtpatch.prove.verifier import ProvingVerifier
from usdtpatch.verification.equivalence import DetourVerifier, verify_detour
from usdtpatch.x86.nops import NOP5
from usdtpatch.x86.relocate import RelocationError, relay_window

pytestmark = pytest.mark.needs_cc
DATA = ROOT / "tests" / "data"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    d = tmp_path_factory.mktemp("relaid")
    for cmd in (["gcc", "-O2", "-fPIC", "-shared", str(DATA / "relay-tls.c"), "-o",
                 str(d / "libtlsprobe.so")],
                ["gcc", "-O2", str(DATA / "relay-tls-main.c"), "-L", str(d), "-ltlsprobe",
                 "-Wl,-rpath,$ORIGIN", "-o", str(d / "tlsmain")],
                ["gcc", "-shared", "-fPIC", str(DATA / "relay-inside.S"), "-o",
                 str(d / "libinside.so")]):
        subprocess.run(cmd, check=True)
    # the same function with an unwind row that changes between the lea and the call
    src = (DATA / "relay-inside.S").read_text().replace(
        "2:\t.value 0x6666", "\tpushq %rax\n\t.cfi_adjust_cfa_offset 8\n2:\t.value 0x6666")
    (d / "row.S").write_text(src)
    subprocess.run(["gcc", "-shared", "-fPIC", str(d / "row.S"), "-o", str(d / "librow.so")],
                   check=True)
    return d


def _site(path: Path, name: str) -> SiteCheck:
    return next(s for s in api.check(path).report.sites if s.probe.name == name)


def test_tls_site_is_relaid_rewritten_and_runs(built: Path) -> None:
    lib = built / "libtlsprobe.so"
    s = _site(lib, "tls")
    assert s.outcome == "in-place" and s.window is not None and s.window.window is not None
    w = s.window.window
    assert w.shape is WindowShape.RELAID and w.size == 17 and w.extra_jumps == 0
    assert s.window.fallback is not None and s.window.fallback.shape is WindowShape.FORWARD
    plan = api.rewrite_plan(lib, fork_guard="never")
    d = plan.sites[0]
    assert d.action.value == "in-place" and d.window is not None
    assert d.window.shape is WindowShape.RELAID and d.new_pc == s.probe.address
    assert d.verification in ("proved", "emulated") and d.detour is None
    out = built / "out"
    out.mkdir()
    shutil.copy2(built / "tlsmain", out / "tlsmain")
    assert run_cli("rewrite", lib, "-o", out / "libtlsprobe.so").rc == 0
    image = parse_elf((out / "libtlsprobe.so").read_bytes())
    new = bytes(image.read_vaddr(w.start, w.size))
    assert new[:5] == NOP5 and new == w.replacement
    assert len(plan.text) == 0 or not any(u.start == w.start for u in plan.unwind)
    want = subprocess.run([str(built / "tlsmain"), "1000000"], capture_output=True,
                          text=True, check=True, timeout=60).stdout
    got = subprocess.run([str(out / "tlsmain"), "1000000"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert got == want
    restored = built / "restored.so"
    assert run_cli("restore", out / "libtlsprobe.so", "-o", restored).rc == 0
    assert restored.read_bytes() == lib.read_bytes()


def test_way_in_inside_refuses(built: Path) -> None:
    """`jg` back to the call: a target strictly inside the 17 bytes: a detour instead."""
    s = _site(built / "libinside.so", "inside")
    assert s.outcome == "forward" and s.window is not None and s.window.fallback is None


def test_unwind_row_change_inside_refuses(built: Path) -> None:
    s = _site(built / "librow.so", "inside")
    assert s.outcome == "forward" and s.window is not None and s.window.fallback is None


CALL_THEN_LONG = (b"\x90" + b"\xe8\x00\x01\x00\x00"  # nop; call 0x1106
                  + b"\x66\x48\x8d\x3d\x00\x10\x00\x00" * 4)  # data16 lea 0x1000(%rip)


def test_relay_window_keeps_anchors() -> None:
    """Four redundant data16 prefixes free 4 bytes; re-laid freely the call's return address
    would move by 4: with it anchored, the call cannot move and the window does not fit."""
    free = relay_window(CALL_THEN_LONG, 0x1000, 1, NOP5)
    assert free.code[:5] == NOP5 and len(free.code) == len(CALL_THEN_LONG)
    assert dict(free.insn_map)[0x1006] != 0x1006  # the return address moved
    with pytest.raises(RelocationError, match="do not fit"):
        relay_window(CALL_THEN_LONG, 0x1000, 1, NOP5, frozenset({0x1006}))


@pytest.mark.parametrize("verifier", ["emulator", "prover"])
def test_mutated_relaid_bytes_are_rejected(built: Path, verifier: str) -> None:
    lib = built / "libtlsprobe.so"
    from usdtpatch.analysis.relay import relay

    rep = api.check(lib).report
    s = rep.sites[0]
    assert rep.context is not None
    got = relay(rep.context, s.probe, NOP5, 0)
    assert not isinstance(got, str)
    image = rep.probeset.image
    check = DetourVerifier() if verifier == "emulator" else ProvingVerifier(DetourVerifier())
    assert check(image, got.window, got.code, (s.probe.address,)) is None
    bad = bytearray(got.code.code)
    bad[5 + 3] ^= 0x08  # lea's displacement: another address in %rdi
    mutated = replace(got.code, code=bytes(bad))
    assert check(image, got.window, mutated, (s.probe.address,)) is not None
    if verifier == "prover":
        # the counterexample is confirmed by the replay, which runs each side's own bytes
        # at the shared address (it ran the re-laid bytes on both sides, saw nothing differ,
        # and the emulator had to decide)
        assert isinstance(check, ProvingVerifier) and check.last_method == "proved"
    assert verify_detour(image, got.window, mutated, (s.probe.address,)) is not None


@pytest.mark.parametrize("options", [{}, {"form": "combo5"}, {"redzone_guard": "always"}],
                         ids=["default", "combo5", "guard-always"])
def test_check_predicts_rewrite(built: Path, options: dict[str, str]) -> None:
    """check = rewrite on the re-laid site, with the options that change it: the red-zone
    guard needs a detour, and combo5's 6 bytes do not fit in the 17 (both then say forward)."""
    from tests.test_check_equals_rewrite import _mismatches

    for lib in ("libtlsprobe.so", "libinside.so", "librow.so"):
        assert _mismatches(built / lib, options or None) == []
    s = next(iter(api.check(built / "libtlsprobe.so", **options).report.sites))
    assert (s.outcome == "forward") == bool(options)


@pytest.mark.live
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
def test_relaid_site_is_optimized_and_traced(built: Path, tmp_path: Path) -> None:
    """Traced by bpftrace, the re-laid site is optimized by the kernel where it is (the
    program reads its own site's first byte after the loop: `e8`, the call to the
    trampoline) and every hit reads its argument as the original's do."""
    lib = built / "libtlsprobe.so"
    s = _site(lib, "tls")
    assert s.function is not None
    offset = s.probe.address - s.function.start  # bump's start is its symbol's
    runs = {}
    for name in ("orig", "new"):
        d = tmp_path / name
        d.mkdir()
        shutil.copy2(built / "tlsmain", d / "tlsmain")
        if name == "orig":
            shutil.copy2(lib, d / "libtlsprobe.so")
        else:
            assert run_cli("rewrite", lib, "-o", d / "libtlsprobe.so").rc == 0
        runs[name] = _traced(d, offset)
    counts = {name: {w: ws[k + 1] for k, w in enumerate(ws[:-1]) if w.startswith("@[")}
              for name, ws in runs.items()}
    assert counts["new"] == counts["orig"] and len(counts["new"]) == 8, counts
    assert runs["new"][1] == "e8" and runs["orig"][1] == "cc", runs  # optimized; int3


def _traced(d: Path, offset: int) -> list[str]:
    """bpftrace attached system-wide to d/libtlsprobe.so (counting each argument value) while
    d/tlsmain runs: the program's output words, then bpftrace's."""
    prog = ('BEGIN { printf("ready\\n"); } '
            f"usdt:{d / 'libtlsprobe.so'}:relay:tls {{ @[arg0] = count(); }}")
    with started(["bpftrace", "-e", prog], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True) as bpftrace:
        tracer = bpftrace.proc
        assert tracer.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while not line.startswith("ready") and time.monotonic() < deadline:
            line = tracer.stdout.readline()
            if not line:
                break
        assert line.startswith("ready"), "bpftrace did not attach"
        ran = subprocess.run([str(d / "tlsmain"), "200000", str(offset)], capture_output=True,
                             text=True, timeout=60, check=True)
        bpftrace.signal(signal.SIGINT)
        text, _err = tracer.communicate(timeout=30)
    out: list[str] = ran.stdout.split() + str(text).split()
    return out


def test_relay_window_takes_the_instructions_decoded_already(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the window's instructions as its function's sweep decoded them, relay_window
    lays out the same bytes without decoding the window again; instructions that do not
    tile the window (another start, a shorter end, a gap) are not taken: it decodes the
    window itself (the branch start decoded every window tried)."""
    from usdtpatch.x86 import relocate
    from usdtpatch.x86.decode import CodeInsn, Sweep, sweep

    insns = sweep(CALL_THEN_LONG, 0x1000).insns
    assert len(insns) == 6
    expected = relay_window(CALL_THEN_LONG, 0x1000, 1, NOP5)
    swept: list[int] = []

    def counted(code: bytes, address: int, mode64: bool = True) -> Sweep:
        swept.append(address)
        return sweep(code, address, mode64)

    monkeypatch.setattr(relocate, "sweep", counted)
    assert relay_window(CALL_THEN_LONG, 0x1000, 1, NOP5, decoded=insns) == expected
    assert 0x1000 not in swept  # (the re-encoded output is decoded, after the site)
    wrong: list[tuple[CodeInsn, ...]] = [insns[1:], insns[:-1], insns[:2] + insns[3:]]
    for w in wrong:
        assert relay_window(CALL_THEN_LONG, 0x1000, 1, NOP5, decoded=w) == expected
    assert swept.count(0x1000) == 3
