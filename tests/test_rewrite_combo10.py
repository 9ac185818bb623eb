"""combo10 sites on a 6.18 target, and %rsp arguments under the red-zone guard (issue 19,
items 4 and 5).

- libbpf's newest usdt.h emits `nop; nop10` (combo10), which only the queued nop10 series
  optimizes. For a 6.18 target (`--form nop5`) every such site becomes a nop5 site: in place
  where the function keeps nothing in its red zone (fixtures/bin/combo10), through a guarded
  detour where it does (fixtures/src/redzone.c built with -DSDT_FORM_COMBO10); for a
  nop10-series target (`--form combo10`) they stay as they are. Before, rewrite skipped them
  all (`site-already-5-byte`) and wrote an identical file while check promised "in place".
- tests/data/rzarg.c: a guarded site whose note says `24@-24(%rsp) 8@-8(%rsp)`: both move by
  +128 (before, the 24-byte one kept its displacement and pointed 128 bytes off).
Every rewritten program runs to the original's output (live: with the probe traced).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, fixture, readelf_sdt_notes, run_cli
from usdtpatch.analysis.check import check
from usdtpatch.api import load
from usdtpatch.x86.nops import NOP5

SRC = ROOT / "fixtures" / "src"

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("combo10")
    built = {"redzone-combo10": out / "redzone-combo10", "rzarg": out / "rzarg"}
    subprocess.run(["gcc", "-O2", "-DSDT_FORM_COMBO10", "-I", str(SRC), str(SRC / "redzone.c"),
                    "-o", str(built["redzone-combo10"])], check=True)
    subprocess.run(["gcc", "-O2", "-I", str(SRC), str(ROOT / "tests" / "data" / "rzarg.c"),
                    "-o", str(built["rzarg"])], check=True)
    return built


def _rewrite(src: Path, out: Path, *opts: str) -> dict[str, object]:
    res = run_cli("rewrite", src, "-o", out, "--json", *opts)
    assert res.rc == 0, res.err
    doc: dict[str, object] = json.loads(res.out)["files"][0]
    return doc


def _sites(doc: dict[str, object]) -> list[dict[str, object]]:
    sites = doc["sites"]
    assert isinstance(sites, list)
    return sites


def _run(path: Path) -> str:
    return subprocess.run([str(path)], capture_output=True, text=True, timeout=60,
                          check=True).stdout


def test_combo10_becomes_nop5_in_place(tmp_path: Path) -> None:
    src = fixture("combo10")
    out = tmp_path / "out"
    doc = _rewrite(src, out, "--form", "nop5")
    assert {s["action"] for s in _sites(doc)} == {"in-place"}
    image = load(out).image
    for s in _sites(doc):
        pc = s["new_pc"]
        assert isinstance(pc, int) and s["address"] == pc
        assert bytes(image.read_vaddr(pc, 11)) == NOP5 + b"\x90" * 6
    assert {s.outcome for s in check(load(src)).sites} == {"in-place"}


def test_combo10_stays_for_a_nop10_series_target(tmp_path: Path) -> None:
    src = fixture("combo10")
    doc = _rewrite(src, tmp_path / "out", "--form", "combo10")
    assert doc["changed"] is False
    assert {s["code"] for s in _sites(doc)} == {"site-already-5-byte"}
    assert (tmp_path / "out").read_bytes() == src.read_bytes()


def test_combo10_in_a_red_zone_function_is_guarded(programs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    src = programs["redzone-combo10"]
    (site,) = check(load(src)).sites
    assert site.probe.site.form.value == "combo10"
    assert site.outcome == "forward"  # the NOP run moves to a guarded detour
    assert any(f.code == "red-zone-rewrite" for f in site.findings)
    out = tmp_path / "out"
    doc = _rewrite(src, out, "--form", "nop5")
    (s,) = _sites(doc)
    assert s["action"] == "detour" and s["guarded"] is True
    assert _run(out) == _run(src)


def test_rsp_arguments_of_any_size_move_with_the_guard(programs: dict[str, Path],
                                                       tmp_path: Path) -> None:
    src = programs["rzarg"]
    out = tmp_path / "out"
    doc = _rewrite(src, out)
    (s,) = _sites(doc)
    assert s["action"] == "detour" and s["guarded"] is True
    (note,) = readelf_sdt_notes(out)
    assert note.args == "24@104(%rsp) 8@120(%rsp)"
    assert _run(out) == _run(src)


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
def test_guarded_combo10_traced(programs: dict[str, Path], tmp_path: Path) -> None:
    src = programs["redzone-combo10"]
    out = tmp_path / "out"
    _rewrite(src, out, "--form", "nop5")

    def traced(path: Path) -> tuple[str, str]:
        done = subprocess.run(
            ["bpftrace", "-e", f"usdt:{path}:redzone:leaf {{ @s = sum(arg0); }}",
             "-c", str(path)], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        lines = done.stdout.splitlines()
        return (next(ln for ln in lines if ln.startswith("redzone-leaf")),
                next(ln for ln in lines if ln.startswith("@s")))

    assert traced(out) == traced(src)


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
def test_guarded_rsp_arguments_traced(programs: dict[str, Path], tmp_path: Path) -> None:
    """bpftrace reads the 8-byte %rsp argument of the guarded site from the rewritten note
    (`8@120(%rsp)`) as it reads `8@-8(%rsp)` in the original; the program's output is the
    same (bpftrace cannot read the 24-byte argument: only its note is checked, above)."""
    src = programs["rzarg"]
    out = tmp_path / "out"
    _rewrite(src, out)

    def traced(path: Path) -> tuple[str, str]:
        done = subprocess.run(
            ["bpftrace", "-e", f"usdt:{path}:rzarg:site {{ @s = sum(arg1); }}",
             "-c", f"{path} 50"], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        lines = done.stdout.splitlines()
        return (next(ln for ln in lines if ln.startswith("rzarg")),
                next(ln for ln in lines if ln.startswith("@s")))

    assert traced(out) == traced(src)
