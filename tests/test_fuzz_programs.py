"""Differential fuzzing of whole programs (tools/fuzz_programs.py, issue 32): a fixed small
campaign finds no difference and its counts are sane; and the oracle rejects each kind of
difference it exists for, on a rewritten program damaged on purpose (a detour that traps, a
changed constant, a probe's note moved to another site, a changed argument) and on outcomes
made up to differ in one field each.

`make fuzz-programs` runs the campaign at length (docs/reliability.md)."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tools import fuzz_programs as fp

DATA = ROOT / "tests" / "data" / "fuzz_programs"
SEED = 20261203
COUNT = 6


@pytest.fixture(autouse=True)
def _wait_for_the_uprobe_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test traces when it says so: it waits for the uprobe tests' lock as they do (the
    campaign leaves a pair untraced when the lock is busy for long)."""
    monkeypatch.setattr(fp, "LOCK_WAIT", 3600.0)


def _tracing_reason() -> str | None:
    if os.geteuid() != 0:
        return "tracing needs root"
    if shutil.which("bpftrace") is None:
        return "bpftrace is not installed"
    return None


def _need(*tools: str) -> None:
    for t in tools:
        if shutil.which(t) is None:
            pytest.skip(f"{t} is not installed")


# --- the fixed campaign ----------------------------------------------------------------------


@pytest.mark.slow
def test_fixed_pairs_find_no_difference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    _need("csmith", "gcc", "clang")
    monkeypatch.chdir(tmp_path)  # a relative work folder, as `--work build/x` gives
    if not (fp.CSMITH_INCLUDE / "csmith.h").is_file():
        pytest.skip("csmith.h is not installed (libcsmith-dev)")
    traced = 20 if _tracing_reason() is None else 0
    results = tmp_path / "results.jsonl"
    pairs = fp.campaign(SEED, COUNT, None, results, Path("work"), start=0,
                        traced_percent=traced, quiet=True)
    t = fp.totals(list(fp.load_results(results).values()))
    assert t["differences"] == 0, [(p.index, p.program, p.build, p.difference) for p in pairs
                                   if p.difference]
    assert t["programs"] == COUNT
    assert t["builds"] >= COUNT - 1  # a random build may fail to link; most do not
    assert t["compared"] >= COUNT // 2
    assert t["sites"] >= 3 * COUNT and t["rewritten"] >= t["sites"] // 2
    assert t["rewritten"] + sum(t["refused"].values()) == t["sites"]
    assert "csmith" in t["kinds"] and len(t["kinds"]) >= 2  # csmith's and a template
    if traced:
        hits = [p.trace_hits for p in pairs if p.traced and p.skipped is None]
        assert hits and all(h is not None and h > 0 for h in hits), hits
    # the same pairs again are the same programs and builds; the file adds up by seed
    again = fp.campaign(SEED, 2, None, results, tmp_path / "work", traced_percent=0,
                        quiet=True)
    assert [p.index for p in again] == [COUNT, COUNT + 1]
    assert fp.totals(list(fp.load_results(results).values()))["programs"] == COUNT + 2
    line = fp.counts_line(t)
    assert line.startswith(f"{COUNT} programs, ") and line.endswith(" 0 differences")


def test_a_pair_is_drawn_again_the_same(tmp_path: Path) -> None:
    _need("csmith")
    for index in range(6):
        a = fp.make_program(SEED, index, fp.pair_random(SEED, index), tmp_path)
        b = fp.make_program(SEED, index, fp.pair_random(SEED, index), tmp_path)
        assert (a.source, a.kind) == (b.source, b.kind)
        assert a.probes > 0 and "STAP_PROBE" in a.source


def test_probes_go_at_statements_with_scalars_in_scope() -> None:
    source = "\n".join([
        '#include "csmith.h"',
        "static int32_t g_1 = 1L;",
        "static int32_t *g_2 = &g_1;",
        "static int16_t  func_3(int16_t  p_4, int32_t * p_5)",
        "{",
        "    int32_t l_6 = 0L;",
        "    g_1 = l_6;",
        "    {",
        "        uint8_t l_7 = 3UL;",
        "        l_6 = l_7;",
        "    }",
        "    l_6++;",
        "    return l_6;",
        "}",
    ]) + "\n"
    text, n = fp.insert_probes(source, random.Random(1))
    assert 3 <= n <= 5 and text.count("STAP_PROBE") == n  # 5 statements to choose from
    assert "#include <sys/sdt.h>" in text
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if "STAP_PROBE" in ln:
            assert lines[i - 1].rstrip().endswith(";") and "return" not in lines[i - 1]
            assert "g_2" not in ln and "p_5" not in ln  # pointers are never arguments
            if i > lines.index("        l_6 = l_7;") + 1:
                assert "l_7" not in ln  # out of its block


# --- the oracle rejects ----------------------------------------------------------------------


def _rewritten_oracle(tmp: Path) -> tuple[Path, Path, dict[str, dict[str, object]]]:
    """tests/data/fuzz_programs/oracle.c built and rewritten (orig/oracle, new/oracle), with
    the rewrite's sites by probe name."""
    _need("gcc")
    (tmp / "orig").mkdir()
    (tmp / "new").mkdir()
    orig, new = tmp / "orig" / "oracle", tmp / "new" / "oracle"
    subprocess.run(["gcc", "-O2", "-o", str(orig), str(DATA / "oracle.c")], check=True)
    done = subprocess.run([sys.executable, "-m", "usdtpatch", "rewrite", "--json", "-o",
                           str(new), str(orig)], capture_output=True, text=True, cwd=ROOT,
                          check=True)
    sites = {s["name"]: s for s in json.loads(done.stdout)["files"][0]["sites"]}
    assert {s["action"] for s in sites.values()} == {"detour"}
    return orig, new, sites


def _patch(path: Path, offset: int, data: bytes) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset:offset + len(data)] = data
    path.write_bytes(bytes(blob))


def _offset(path: Path, vaddr: int) -> int:
    from usdtpatch.elf.image import parse_elf

    off = parse_elf(path.read_bytes()).vaddr_to_offset(vaddr)
    assert off is not None
    return off


def _note_pc_offsets(path: Path) -> dict[str, int]:
    """File offset of each probe's pc field in .note.stapsdt, by probe name."""
    from usdtpatch.elf.image import parse_elf
    from usdtpatch.elf.notes import SdtNote, parse_notes

    image = parse_elf(path.read_bytes())
    sec = image.section(".note.stapsdt")
    assert sec is not None
    notes = parse_notes(image.section_data(sec), 8, "<").notes
    return {n.name: sec.offset + n.offset + 12 + 8 for n in notes if isinstance(n, SdtNote)}


def test_the_undamaged_rewrite_is_no_difference(tmp_path: Path) -> None:
    orig, new, _ = _rewritten_oracle(tmp_path)
    diff, skipped, _ = fp.oracle(orig, new, [orig], [new], traced=_tracing_reason() is None)
    assert (diff, skipped) == (None, None)


def test_a_detour_that_traps_is_a_difference(tmp_path: Path) -> None:
    orig, new, sites = _rewritten_oracle(tmp_path)
    detour = sites["p0"]["detour"]
    assert isinstance(detour, dict)
    _patch(new, _offset(new, detour["address"]), b"\xcc")
    diff, _, _ = fp.oracle(orig, new, [orig], [new], traced=False)
    assert diff is not None and "rewritten signal 5" in diff, diff
    assert fp.difference_class(diff) == "signal 5"


def test_a_changed_constant_is_a_difference(tmp_path: Path) -> None:
    orig, new, _ = _rewritten_oracle(tmp_path)
    at = new.read_bytes().index(b"oracle sum=")
    _patch(new, at, b"0")
    diff, _, _ = fp.oracle(orig, new, [orig], [new], traced=False)
    assert diff is not None and diff.startswith("output:"), diff
    assert fp.difference_class(diff) == "output"


def test_a_probe_hit_a_different_number_of_times_is_a_difference(tmp_path: Path) -> None:
    if (reason := _tracing_reason()) is not None:
        pytest.skip(reason)
    orig, new, _ = _rewritten_oracle(tmp_path)
    pcs = _note_pc_offsets(new)
    p0_pc = new.read_bytes()[pcs["p0"]:pcs["p0"] + 8]
    _patch(new, pcs["p1"], p0_pc)  # p1's note names p0's site: hit 10 times, not once
    diff, skipped, hits = fp.oracle(orig, new, [orig], [new], traced=True)
    assert skipped is None and hits == 11
    assert diff is not None and diff.startswith("traced counts:"), diff
    assert "@hits[oracle:p1]: 1 vs 10" in diff


def test_a_changed_argument_is_a_difference(tmp_path: Path) -> None:
    if (reason := _tracing_reason()) is not None:
        pytest.skip(reason)
    orig, new, _ = _rewritten_oracle(tmp_path)
    data = new.read_bytes()
    assert b"@$42" in data
    new.write_bytes(data.replace(b"@$42", b"@$43"))  # p0's constant argument (every copy)
    diff, skipped, _ = fp.oracle(orig, new, [orig], [new], traced=True)
    assert skipped is None
    assert diff is not None and diff.startswith("traced arguments:"), diff
    assert "@args[oracle:p0, 1]: 420 vs 430" in diff


def test_every_field_of_an_outcome_is_compared() -> None:
    base = fp.Outcome("checksum = 1\n", 0, None, False)
    assert fp.compare_runs(base, fp.Outcome("checksum = 1\n", 0, None, False)) is None
    for other, cls in [(fp.Outcome("checksum = 2\n", 0, None, False), "output"),
                       (fp.Outcome("checksum = 1\n", 1, None, False), "exit"),
                       (fp.Outcome("", None, 11, False), "signal 11"),
                       (fp.Outcome("", None, None, True), "timeout")]:
        diff = fp.compare_runs(base, other)
        assert diff is not None and fp.difference_class(diff) == cls, (other, diff)


def test_every_map_of_a_trace_is_compared() -> None:
    a = {"@hits[prog:p0]": 3, "@args[prog:p0, 0]": 6}
    assert fp.compare_traces(a, dict(a)) is None
    assert fp.compare_traces("bpftrace did not start", "bpftrace did not start") is None
    diff = fp.compare_traces(a, {"@hits[prog:p0]": 3, "@args[prog:p0, 0]": 7})
    assert diff is not None and fp.difference_class(diff) == "traced arguments"
    diff = fp.compare_traces(a, {"@args[prog:p0, 0]": 6})  # a probe never hit
    assert diff is not None and fp.difference_class(diff) == "traced counts"
    diff = fp.compare_traces(a, "timeout while traced")
    assert diff is not None and "rewritten timeout while traced" in diff


def test_a_hang_of_the_rewrite_is_a_difference(tmp_path: Path) -> None:
    _need("gcc")
    src = tmp_path / "hang.c"
    src.write_text("int main(void) { for (;;) ; }\n")
    subprocess.run(["gcc", "-O0", "-o", str(tmp_path / "hang"), str(src)], check=True)
    out = fp.run(tmp_path / "hang", timeout=0.5)
    assert out.timeout and out.describe() == "timeout"
    diff = fp.compare_runs(fp.Outcome("", 0, None, False), out)
    assert diff is not None and fp.difference_class(diff) == "timeout"


def test_a_rewrite_that_fails_is_a_difference(tmp_path: Path) -> None:
    orig, _, _ = _rewritten_oracle(tmp_path)
    crash = [sys.executable, "-c", "raise RuntimeError('a bug')"]  # a traceback, exit 1
    rw = fp.rewrite_files([orig], tmp_path / "crash", usdtpatch=crash)
    assert rw.error is not None and "RuntimeError" in rw.error
    assert fp.difference_class(f"rewrite failed: {rw.error}") == "rewrite failed"
    # a file refused as a whole (exit 2, one line) is a refusal of its sites, not a failure
    refuse = [sys.executable, "-c", "import json, sys; print(json.dumps({'files': [], "
              f"'errors': [{{'path': '{orig}', 'error': 'the fork guard cannot be added "
              "(why)'}]})); print('usdtpatch: no', file=sys.stderr); sys.exit(2)"]
    rw = fp.rewrite_files([orig], tmp_path / "refused", usdtpatch=refuse)
    assert rw.error is None and rw.sites == 2 and rw.rewritten == 0
    assert rw.refused == {"file: the fork guard cannot be added": 2}


def test_the_note_pc_layout_is_the_one_parsed(tmp_path: Path) -> None:
    orig, _, sites = _rewritten_oracle(tmp_path)
    pcs = _note_pc_offsets(orig)
    data = orig.read_bytes()
    assert struct.unpack_from("<Q", data, pcs["p0"])[0] == sites["p0"]["address"]


# --- the classes the campaign found ----------------------------------------------------------


@pytest.mark.slow
def test_a_fault_the_rewrite_moves_throws_from_its_handler_as_before(tmp_path: Path) -> None:
    """sigthrow.cc's pair (77, 5), gcc -O1 PIE -fnon-call-exceptions: the rewrite moves a
    faulting instruction (a division by zero or a load through a null pointer) into a
    detour, the handler throws through it, and the rewritten program prints what the
    original prints, having caught its faults."""
    _need("gcc", "clang")
    pair = fp.run_pair(77, 5, tmp_path / "pair", traced_percent=0, kind="sigthrow.cc")
    assert pair.difference is None and pair.sites > 0 and pair.rewritten == pair.sites, pair
    prog = tmp_path / "pair" / "orig" / "prog"
    done = subprocess.run([sys.executable, "-m", "usdtpatch", "rewrite", "--json", "--dry-run",
                           str(prog)], capture_output=True, text=True, check=True, cwd=ROOT)
    moved = [f for file in json.loads(done.stdout)["files"] for s in file["sites"]
             for f in s["faults"]]
    assert moved, "no faulting instruction in a window: the pair tests nothing"
    out = subprocess.run([str(prog)], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.startswith("sigthrow ") and int(out.stdout.split()[2]) > 0, out.stdout


@pytest.mark.slow
def test_vfork_and_clone_children_survive_tracing(tmp_path: Path) -> None:
    """clone.c's pair (77, 3), clang -O0 static: children made by vfork, clone(SIGCHLD) and
    clone(CLONE_VM|CLONE_VFORK) pass probes while every probe is traced; the rewrite's exit
    codes, output and hits are the original's."""
    _need("gcc", "clang")
    why = _tracing_reason()
    if why is not None:
        pytest.skip(why)
    pair = fp.run_pair(77, 3, tmp_path / "pair", traced_percent=100, kind="clone.c")
    assert pair.traced and pair.skipped is None, pair
    assert pair.difference is None and pair.sites > 0 and pair.rewritten == pair.sites, pair
    assert pair.trace_hits is not None and pair.trace_hits > 0


def test_a_loop_after_the_probe_in_one_run_relocates() -> None:
    """Pair 1-35 (clang -Os, csmith): a 1-byte probe, then a loop whose `ja` goes back into
    the window with no other probe between. iced's block encoder moves that branch with its
    target, and the first layout expected it unmoved: relocation-failed ("branch target of
    'ja 0x401168' moved"), the site left. The loop's copy must branch to the copy."""
    from usdtpatch.x86.decode import sweep
    from usdtpatch.x86.nops import NOP5
    from usdtpatch.x86.relocate import Replacement, relocate_window

    # 0x40115e: nop; xor %eax,%eax; mov $9,%ecx; 0x401166: mov %eax,%edx; 0x401168: mov
    # %edx,%esi; shr; mov; xor $0xedb88320; test $1,%dl; mov; cmove; dec %ecx;
    # cmp $1,%ecx; ja 0x401168
    code = bytes.fromhex("9031c0b90900000089c289d6d1ee89f781f72083b8edf6c20189fa0f44d6ffc9"
                         "83f90177e5")
    detour = relocate_window(code, 0x40115E, [Replacement(0x40115E, 1, NOP5)], 0x405300)
    where = dict(detour.insn_map)
    insns = sweep(detour.code, detour.address).insns
    ja = next(i for i in insns if i.base_mnemonic == "ja")
    assert ja.target == where[0x401168]
    assert insns[-1].target == 0x40115E + len(code)  # and back to the window's end


# --- differences kept and reduced ------------------------------------------------------------

FOUND = sorted(fp.FOUND.glob("*.c*")) if fp.FOUND.is_dir() else []


@pytest.mark.slow
@pytest.mark.parametrize("path", FOUND, ids=[p.name for p in FOUND])
def test_a_kept_reproducer_shows_no_difference(path: Path) -> None:
    """Each reduced program the campaign kept (tests/data/fuzz_programs/found): built its way
    and rewritten, it no longer shows its difference."""
    _need("gcc", "clang")
    build, want, traced = fp.reproducer_spec(path)
    if traced and (reason := _tracing_reason()) is not None:
        pytest.skip(reason)
    assert not fp.interesting(path, build, want, traced)


@pytest.mark.slow
def test_a_broken_rewrite_is_kept_and_reduced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    """FUZZ_PROGRAMS_DAMAGE=trap breaks every detour: the pair shows the difference, cvise
    reduces the program (15 s) to a smaller one that still shows it, and it is kept with the
    header the reproducer test reads."""
    _need("gcc", "clang", "cvise")
    monkeypatch.setenv(fp.DAMAGE, "trap")
    pair = fp.run_pair(5, 3, tmp_path / "pair", traced_percent=0, kind="jmp.c")
    assert pair.difference is not None and fp.difference_class(pair.difference) == "signal 5"
    reduced = fp.reduce(pair, tmp_path / "pair", 15)
    assert reduced is not None
    before = (tmp_path / "pair" / "orig" / "prog.c").read_text()
    assert len(reduced.read_text()) < len(before)
    kept = fp.keep_reproducer(pair, reduced, into=tmp_path / "found")
    build, want, traced = fp.reproducer_spec(kept)
    assert (build.describe(), want, traced) == (pair.build, "signal 5", False)
    assert fp.interesting(kept, build, want, traced)
    monkeypatch.delenv(fp.DAMAGE)
    assert not fp.interesting(kept, build, want, traced)  # undamaged: no difference


# --- the campaign's record and its page -----------------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs"
RECORD = DOCS / "campaigns" / "fuzz-programs-seed1.jsonl.gz"
PAGE = DOCS / "reliability.md"


def _figure(n: int) -> str:
    return f"{n:,}"


def test_the_pages_campaign_figures_are_its_records() -> None:
    """docs/reliability.md's campaign figures are the totals of the record kept beside it
    (the campaign's results file, compressed): a figure typed by hand, or a record replaced
    without the page, fails here."""
    t = fp.totals(list(fp.load_results(RECORD).values()))
    page = PAGE.read_text()
    section = page[page.index("### The campaign so far"):page.index("## Running it")]
    assert f"**{_figure(t['programs'])} program-and-build\npairs**" in section or \
        f"**{_figure(t['programs'])} program-and-build pairs**" in section
    assert f"**{_figure(t['traced'])} traced**" in section
    assert f"{_figure(t['compared'])} compared" in section
    assert f"| tried | {_figure(t['sites'])} |" in section
    assert f"| rewritten | {_figure(t['rewritten'])} |" in section
    for code, n in t["refused"].items():
        rows = [ln for ln in section.splitlines()
                if ln.startswith("| refused ") and ln.endswith(f"| {_figure(n)} |")]
        named = code.removeprefix("file: ")
        assert any(f"`{code}`" in ln or named in ln for ln in rows), (code, n)
    assert f"| **{t['differences']}**, found and fixed" in section
    assert t["programs"] >= 5000 and t["traced"] >= 500  # issue 32's campaign size
