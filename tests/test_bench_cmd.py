"""`usdtpatch bench` with tiny counts: the structure of its table, JSON and chart, and that
every figure is a positive measurement (speed itself is the benchmark's business, not a
test's); the trigger builds have the site bytes each form promises; the refusals are one
line. The JVM workload (a 263 MB JDK copy and a libjvm rewrite) is `slow`.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from usdtpatch.cli import main
from usdtpatch.live.bench import runner
from usdtpatch.report.bench import chart

SITE_BYTES = {"stap-nop1": "90", "hdr-nop5": "0f 1f 44 00 00",
              "hdr-combo5": "0f 1f 44 00 00",  # the nop5 at pc + 1 is what is probed
              "hdr-combo10": "90", "hdr-nop1": "90", "rewritten": "0f 1f 44 00 00"}


def _bench(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(["bench", *args], out, err)
    return rc, out.getvalue(), err.getvalue()


def _need_cc() -> None:
    if shutil.which("cc") is None:
        pytest.skip("no cc")


@pytest.fixture(scope="module")
def trigger_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tests.conftest import live_kernel_reason

    reason = live_kernel_reason()
    if reason is not None:
        pytest.skip(reason)
    _need_cc()
    work = tmp_path_factory.mktemp("bench")
    rc, out, err = _bench(["--only", "trigger", "--iterations", "3000", "--repeats", "2",
                           "--json", "--workdir", str(work)])
    assert rc == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


@pytest.mark.live
@pytest.mark.needs_cc
def test_trigger_json_structure(trigger_doc: dict[str, Any]) -> None:
    doc = trigger_doc
    assert doc["schema"] == "usdtpatch/bench" and doc["schema_version"] == 1
    assert doc["iterations"] == 3000 and doc["repeats"] == 2 and doc["jvm"] == []
    assert doc["kernel"] == os.uname().release
    rows = {r["name"]: r for r in doc["trigger"]}
    assert list(rows) == list(SITE_BYTES)
    for name, r in rows.items():
        assert r["site"] == SITE_BYTES[name], name
        assert r["runs"] == 2 and r["hits"] == 3000
        for key in ("traced_hits_per_s", "traced_ns_per_hit", "untraced_ns_per_pass",
                    "ratio_traced", "ratio_untraced"):
            assert r[key] > 0, (name, key)
        lo, hi = r["ratio_traced_range"]
        assert 0 < lo <= r["ratio_traced"] <= hi
    ref = rows["stap-nop1"]
    assert ref["ratio_traced"] == 1.0 and ref["ratio_untraced"] == 1.0
    assert ref["ratio_traced_range"] == [1.0, 1.0]


@pytest.mark.live
@pytest.mark.needs_cc
def test_trigger_table_and_chart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from tests.conftest import live_kernel_reason

    if live_kernel_reason() is not None:
        pytest.skip(str(live_kernel_reason()))
    _need_cc()
    png = tmp_path / "bench.png"
    rc, out, err = _bench(["--only", "trigger", "--iterations", "2000", "--repeats", "1",
                           "--chart", str(png), "--workdir", str(tmp_path / "w")])
    assert rc == 0, err
    assert "M hits/s traced" in out and "ns/pass untraced" in out
    for name in SITE_BYTES:
        assert name in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chart_without_matplotlib_is_refused(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    import builtins

    real_import = builtins.__import__

    def no_mpl(name: str, *args: Any, **kw: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    rep = runner.BenchReport("k", "cpu", 1, 1, 1, [], [], 0.0, [])
    assert chart(rep, tmp_path / "x.png") is False
    assert not (tmp_path / "x.png").exists()


def test_refuses_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rc, out, err = _bench(["--only", "trigger"])
    assert rc == 2 and out == "" and err.count("\n") == 1 and "needs root" in err


def test_refuses_a_missing_jdk(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root check comes first")
    rc, out, err = _bench(["--only", "jvm", "--jdk", str(tmp_path / "nojdk"), "--workdir",
                           str(tmp_path / "w")])
    assert rc == 2 and out == "" and err.count("\n") == 1 and "no OpenJDK" in err


@pytest.mark.parametrize("bad", [["--iterations", "0"], ["--repeats", "-1"],
                                 ["--jvm-calls", "x"], ["--only", "both"]])
def test_bad_counts_are_usage_errors(bad: list[str]) -> None:
    rc, out, _ = _bench(bad)
    assert rc == 2 and out == ""


@pytest.mark.live
@pytest.mark.slow
def test_jvm_workload(tmp_path: Path) -> None:
    if not (runner.SYSTEM_JDK / "lib" / "server" / "libjvm.so").exists():
        pytest.skip(f"no OpenJDK 17 at {runner.SYSTEM_JDK}")
    rc, out, err = _bench(["--only", "jvm", "--jvm-calls", "20000", "--repeats", "1",
                           "--json", "--workdir", str(tmp_path)])
    assert rc == 0, err
    doc = json.loads(out)
    rows = {r["name"]: r for r in doc["jvm"]}
    assert list(rows) == ["jvm-original", "jvm-rewritten"]
    assert rows["jvm-original"]["site"] == "90"
    assert rows["jvm-rewritten"]["site"] == "0f 1f 44 00 00"
    for r in rows.values():
        assert r["hits"] >= 2 * 20000  # entry + return of every Bench.step call, at least
        assert r["traced_hits_per_s"] > 0 and r["traced_wall_s"] > 0
        assert r["untraced_wall_s"] > 0
    # the system JDK is untouched: the copies are separate files
    lib = runner.SYSTEM_JDK / "lib" / "server" / "libjvm.so"
    assert os.path.realpath(lib) != str(tmp_path / "jdk-rewritten" / "lib" / "server" /
                                        "libjvm.so")


def test_rows_are_medians_of_per_round_ratios() -> None:
    def variant(name: str) -> runner.Variant:
        return runner.Variant(name, name, Path("/x"), Path("/x"), (("p:n", 0),), "90")

    ref, other = variant("stap-nop1"), variant("other")
    data = {
        "stap-nop1": runner.Measure([1e9, 2e9, 1e9], [1000, 1000, 1000], [10.0, 20.0, 10.0]),
        # twice the reference's hits/s in every round, whatever the round's load
        "other": runner.Measure([0.5e9, 1e9, 0.5e9], [1000, 1000, 1000], [5.0, 40.0, 10.0]),
    }
    rows = {r.name: r for r in runner.median_rows([ref, other], data, 10, "stap-nop1", False)}
    assert rows["stap-nop1"].ratio_traced == 1.0
    assert rows["other"].ratio_traced == pytest.approx(2.0)
    assert rows["other"].ratio_traced_range == pytest.approx((2.0, 2.0))
    assert rows["other"].traced_hits_per_s == pytest.approx(2000.0)  # median of 2000, 1000, 2000
    assert rows["other"].ratio_untraced == pytest.approx(1.0)  # rounds: 0.5, 2.0, 1.0
    assert rows["other"].untraced_ns_per_pass == pytest.approx(1.0)  # median 10 ns / 10 passes
    assert rows["other"].traced_ns_per_hit == pytest.approx(0.5e9 / 1000)


def test_a_ratio_within_the_noise_says_so() -> None:
    """Item 9 of issue 34: hdr-nop5 was below stap-nop1 in median hits/s while its ratio
    column read 1.65, with no word; a ratio whose rounds reach both sides of 1, or that the
    medians contradict, now reads `noise`, and a line says what that means."""
    import io

    from usdtpatch.report.bench import NOISE_NOTE, is_noise, print_bench

    def row(name: str, rate: float, ratio: float, lo: float, hi: float) -> runner.Row:
        return runner.Row(name, name, "90", 3, 1000, rate, ratio, 1.0, 1.0, 1.0, (lo, hi))

    ref = row("stap-nop1", 2e6, 1.0, 1.0, 1.0)
    clear = row("usdtpatch-nop5", 9e6, 4.5, 4.1, 5.0)
    spread = row("wide", 3e6, 1.5, 0.6, 2.9)
    against = row("hdr-nop5", 1.8e6, 1.65, 1.2, 2.0)  # below the reference, ratio above 1
    assert not is_noise(ref, ref) and not is_noise(clear, ref)
    assert is_noise(spread, ref) and is_noise(against, ref)
    rep = runner.BenchReport("6.18", "cpu", 10, 0, 3, [ref, clear, spread, against], [], 1.0,
                             [])
    out = io.StringIO()
    print_bench(rep, out)
    lines = {ln.split()[0]: ln for ln in out.getvalue().splitlines() if ln.strip()}
    assert "1.65 (1.20-2.00) noise " in lines["hdr-nop5"]
    assert "(0.60-2.90) noise " in lines["wide"]
    assert "noise" not in lines["usdtpatch-nop5"] and "noise" not in lines["stap-nop1"]
    assert NOISE_NOTE in out.getvalue()
