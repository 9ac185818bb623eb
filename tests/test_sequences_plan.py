"""`usdtpatch plan`: the plan per site form, its versioned JSON (round trip, bad documents),
and the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import fixture, run_cli
from usdtpatch.api import load
from usdtpatch.errors import InputError
from usdtpatch.report.plan import plan_json
from usdtpatch.sequences.plan import PLAN_SCHEMA, build_plan, plan_from_json
from usdtpatch.sequences.trampoline import default_load_base


def _plan_doc(name: str, protocol: str = "nop5") -> dict[str, Any]:
    ps = load(str(fixture(name)))
    return plan_json(build_plan(ps, name, protocol, default_load_base(ps.image)))


@pytest.mark.parametrize(("name", "protocol", "want"), [
    ("nop5", "nop5", ["nop5"] * 3),
    ("nop5-alt", "nop5", ["nop5"] * 3),
    ("combo5", "nop5", ["nop5"] * 3),
    ("nop10", "nop10", ["nop10"] * 3),
    ("combo10", "nop10", ["nop10"] * 3),
    ("combo10", "nop5", ["int3"] * 3),
    ("pie", "nop5", ["int3"] * 3),
    ("nop5-pagecross", "nop5", ["int3", "nop5"]),
    ("dsprefix", "nop5", [None] * 3),
    ("nop10", "nop5", [None] * 3),
    ("i386", "nop5", ["int3"] * 3),
], ids=lambda v: v if isinstance(v, str) else None)
def test_protocol_per_site(name: str, protocol: str, want: list[str | None]) -> None:
    doc = _plan_doc(name, protocol)
    assert [s["protocol"] for s in doc["sites"]] == want


def test_combo5_probes_pc_plus_1() -> None:
    ps = load(str(fixture("combo5")))
    doc = _plan_doc("combo5")
    for s in doc["sites"]:
        probe = next(p for p in ps.probes if f"{p.provider}:{p.name}" == s["probe"])
        assert s["link_address"] == probe.address + 1
        assert s["original"] == "0f1f440000"


def test_trampoline_shared_and_below_the_executable() -> None:
    doc = _plan_doc("nop5")
    assert doc["trampolines"] == [0x555555553000]
    assert {s["trampoline"] for s in doc["sites"]} == {0x555555553000}


def test_json_round_trip() -> None:
    for name, proto in (("nop5", "nop5"), ("nop10", "nop10"), ("pie", "nop5"),
                        ("dsprefix", "nop5")):
        doc = _plan_doc(name, proto)
        assert plan_json(plan_from_json(json.loads(json.dumps(doc)))) == doc


def _mutate(doc: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    d = json.loads(json.dumps(doc))
    cur = d
    for k in path[:-1]:
        cur = cur[k]
    if value is KeyError:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return d  # type: ignore[no-any-return]


@pytest.mark.parametrize(("path", "value", "message"), [
    (["schema"], "other", "schema"),
    (["schema_version"], 99, "not supported"),
    (["protocol"], "nop7", "protocol"),
    (["sites"], {}, "expected a list"),
    (["sites", 0, "address"], "0x10", "expected an integer"),
    (["sites", 0, "original"], "zz", "not hex"),
    (["sites", 0, "sequences", "optimize", "steps", 0, "write"], 5, "hex string"),
    (["sites", 0, "sequences", "attach"], None, "attach and detach are required"),
    (["sites", 0, "guarded"], KeyError, "missing key 'guarded'"),
    (["sites", 0, "sequences", "detach", "steps", 0, "address"], 5, "not the sequence address"),
    (["sites", 0, "address"], -1, "not a 64-bit address"),
], ids=["schema", "version", "protocol", "sites", "address", "hex", "write", "attach",
        "missing", "step-address", "negative"])
def test_bad_plan_documents(path: list[str | int], value: Any, message: str) -> None:
    doc = _mutate(_plan_doc("nop5"), path, value)
    with pytest.raises(InputError, match=message):
        plan_from_json(doc, "p.json")


def test_cli_plan_text() -> None:
    r = run_cli("plan", fixture("nop5"))
    assert r.rc == 0, r.err
    assert "nop5 protocol (Linux 6.18)" in r.out
    assert "e8 " in r.out and "callq 0x555555553000" in r.out
    assert r.out.count("  optimize:") == 3 and r.out.count("  unoptimize:") == 3


def test_cli_plan_json_and_options(tmp_path: Path) -> None:
    r = run_cli("plan", fixture("nop5"), "--json", "--load-base", "0x7f0000000000")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["schema"] == PLAN_SCHEMA and doc["schema_version"] == 1
    assert doc["load_base"] == 0x7F0000000000 and doc["trampolines"] == [0x7EFFFFFFF000]
    r = run_cli("plan", fixture("nop5"), "--json", "--trampoline", "0x555555500000")
    assert {s["trampoline"] for s in json.loads(r.out)["sites"]} == {0x555555500000}
    maps = tmp_path / "maps"
    maps.write_text("555555554000-555555555000 r--p 00000000 fe:01 1 /x/nop5\n"
                    "555555555000-555555559000 r-xp 00001000 fe:01 1 /x/nop5\n"
                    "555555559000-55555557a000 rw-p 00000000 00:00 0 [heap]\n"
                    "555555550000-555555554000 rw-p 00000000 00:00 0\n")
    r = run_cli("plan", fixture("nop5"), "--json", "--maps", maps)
    assert r.rc == 0, r.err
    assert json.loads(r.out)["trampolines"] == [0x55555554F000]
    r = run_cli("plan", fixture("combo10"), "--form", "nop10")
    assert "nop10 protocol" in r.out and "lea" in r.out and "EXPERIMENTAL" not in r.out


@pytest.mark.parametrize("argv", [
    ["plan", str(fixture("aarch64"))],
    ["plan", str(fixture("nop5")), "--load-base", "0x1001"],
    ["plan", str(fixture("nopie")), "--load-base", "0x10000"],
    ["plan", str(fixture("nop5")), "--maps", "/nonexistent/maps"],
    ["plan", "/nonexistent/file"],
    ["plan", str(fixture("nop5")), "--trampoline", "zz"],
    ["plan", str(fixture("nop5")), "--pid", "999999999"],
], ids=["aarch64", "unaligned-base", "moved-exec", "no-maps", "no-file", "bad-addr", "no-pid"])
def test_cli_plan_bad_input(argv: list[str]) -> None:
    r = run_cli(*argv)
    assert r.rc == 2
    assert "Traceback" not in r.err and r.err.count("\n") <= 3


def test_cli_plan_maps_without_the_file(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("555555554000-555555555000 r--p 00000000 fe:01 1 /x/other\n")
    r = run_cli("plan", fixture("nop5"), "--maps", maps)
    assert r.rc == 2 and "not mapped" in r.err
