"""`usdtpatch list` as a user sees it: text (golden), filters, names, semaphores, base moves."""

from __future__ import annotations

import json

import pytest

from tests.golden import check_golden
from tests.helpers import ROOT, fixture, run_cli
from usdtpatch.elf.image import parse_elf


@pytest.mark.parametrize("name", ["pie", "sema-dtrace", "cxx-throw", "forms-mixed", "odd-note",
                                  "bad-args", "prelinked", "aarch64"])
def test_text_output_golden(name: str) -> None:
    res = run_cli("list", fixture(name))
    assert res.rc == 0, res.err
    check_golden(f"list-{name}.txt", res.out.replace(str(ROOT) + "/", ""))


def test_filters() -> None:
    doc = json.loads(run_cli("list", "--json", fixture("forms-mixed"), "--probe", "nop5").out)
    assert [p["name"] for p in doc["files"][0]["probes"]] == ["nop5"]
    assert doc["files"][0]["probe_count"] == 10
    res = run_cli("list", "--json", fixture("forms-mixed"), "--provider", "x")
    assert res.rc == 2 and res.out == "" and "no probe matches --provider x" in res.err


def test_cxx_names_are_demangled() -> None:
    doc = json.loads(run_cli("list", "--json", fixture("cxx-throw")).out)
    functions = {p["function"] for p in doc["files"][0]["probes"]}
    assert "holder(int)+0x3" in functions


@pytest.mark.parametrize("name", ["sema-dtrace", "sema-explicit"])
def test_semaphores_resolve_to_probes_section(name: str) -> None:
    doc = json.loads(run_cli("list", "--json", fixture(name)).out)
    image = parse_elf(fixture(name).read_bytes())
    sems = [p["semaphore"] for p in doc["files"][0]["probes"] if p["semaphore"]]
    assert sems
    for sem in sems:
        assert sem["section"] == ".probes"
        sec = image.section(".probes")
        assert sec is not None and sec.offset <= sem["file_offset"] < sec.offset + sec.size


def test_prelinked_base_adjustment_lands_on_the_nop() -> None:
    doc = json.loads(run_cli("list", "--json", fixture("prelinked")).out)
    f = doc["files"][0]
    assert "note-base-moved" in {x["code"] for x in f["findings"]}
    for p in f["probes"]:
        assert p["address"] != p["note"]["pc"]
        assert p["site"]["form"] == "nop1"  # the adjusted address holds the probe's nop


def test_without_adjustment_the_prelinked_pc_would_be_wrong() -> None:
    """The fixture really moves things: the raw note pc is not in the file's code."""
    image = parse_elf(fixture("prelinked").read_bytes())
    doc = json.loads(run_cli("list", "--json", fixture("prelinked")).out)
    for p in doc["files"][0]["probes"]:
        assert image.read_vaddr(p["note"]["pc"], 1) != b"\x90"


def test_stripped_file_still_lists() -> None:
    doc = json.loads(run_cli("list", "--json", fixture("stripped")).out)
    f = doc["files"][0]
    assert f["probes"] and all(p["site"]["form"] == "nop1" for p in f["probes"])


def test_no_probes_is_not_an_error() -> None:
    res = run_cli("list", fixture("noprobes"))
    assert res.rc == 0 and "0 probe(s)" in res.out


def test_usage_errors_exit_2() -> None:
    assert run_cli("list").rc == 2
    assert run_cli("frobnicate").rc == 2
    assert run_cli().rc == 2


def test_demo_runs_on_its_fixture() -> None:
    res = run_cli("demo")
    assert res.rc == 0, res.err
    assert "probe(s)" in res.out


@pytest.mark.parametrize(("name", "lost"), [("nop10", 3), ("combo10", 0), ("nop5", 0),
                                            ("dsprefix", 0)])
def test_a_site_some_generation_cannot_probe_is_a_finding(name: str, lost: int) -> None:
    """A bare nop10 at a note pc is probed by the nop10 generation alone: 6.1 and 6.18 lose a
    probe there without a word (measured), so `list` says so for each such site; a `90` in
    front (combo10) is probed everywhere, and a site no generation probes is check's
    site-segment-prefix."""
    res = run_cli("list", "--json", fixture(name))
    assert res.rc == 0, res.err
    found = [f for f in json.loads(res.out)["files"][0]["findings"]
             if f["code"] == "site-probe-lost"]
    assert len(found) == lost
    for f in found:
        assert "only the nop10 generation probes it" in f["message"]
        assert "none, nop5" in f["message"]
