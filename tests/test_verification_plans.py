"""`usdtpatch verify`: torn-state verification in the emulator. Every fixture nop5 site
passes, nop10 fixtures pass under the nop10 generation's protocol, the seven wrong sequences are
rejected with their reasons, the red zone is measured, a guarded site is shown clean."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import NOP5_GEN, fixture, fixture_files, run_cli
from usdtpatch.api import load
from usdtpatch.cli.cmd_verify import summarize
from usdtpatch.errors import UsdtpatchError
from usdtpatch.report.plan import plan_json
from usdtpatch.sequences.plan import Plan, build_plan, with_site
from usdtpatch.sequences.trampoline import default_load_base
from usdtpatch.sequences.wrong import crossing_site, wrong_sequences
from usdtpatch.verification.machine import Machine
from usdtpatch.verification.plans import FAIL, PASS, SKIP, verify_plan, verify_site
from usdtpatch.x86.nops import NOP5


def _plan(name: str | Path, protocol: str = "nop5") -> Plan:
    ps = load(str(fixture(str(name)) if isinstance(name, str) else name))
    return build_plan(ps, str(name), protocol, default_load_base(ps.image))


def _x86_fixtures() -> list[Path]:
    out = []
    for p in fixture_files():
        try:
            ps = load(str(p))
        except UsdtpatchError:
            continue
        if ps.image.machine == 62 and ps.probes:
            out.append(p)
    return out


@pytest.mark.parametrize("path", _x86_fixtures(), ids=lambda p: p.name)
def test_every_fixture_site_passes_or_is_skipped(path: Path) -> None:
    for proto in ("nop5", "nop10"):
        plan = _plan(path, proto)
        rep = verify_plan(plan, load(str(path)).image)
        assert rep.ok, [(v.probe, v.codes) for v in rep.verdicts]
        for site, v in zip(plan.sites, rep.verdicts, strict=True):
            if site.sequences is not None and site.sequences.optimize is not None:
                assert v.status == PASS and v.runs > 0
            if v.status == SKIP:
                assert v.reason


def test_nop5_fixture_sites_are_optimized_and_verified() -> None:
    optimized = 0
    for path in _x86_fixtures():
        plan = _plan(path)
        rep = verify_plan(plan, load(str(path)).image)
        for site, v in zip(plan.sites, rep.verdicts, strict=True):
            if site.sequences is not None and site.sequences.protocol == "nop5":
                assert v.status == PASS
                assert v.red_zone_writes == tuple(range(-32, 0))
                optimized += 1
    assert optimized >= 15


@pytest.mark.parametrize("name", ["nop10", "combo10"])
def test_nop10_verifies_and_spares_the_red_zone(name: str) -> None:
    plan = _plan(name, "nop10")
    rep = verify_plan(plan, load(str(fixture(name))).image)
    assert [v.status for v in rep.verdicts] == [PASS] * 3
    assert all(v.protocol == "nop10" and not v.red_zone_writes and not v.hazards
               for v in rep.verdicts)


def _wrong_cases() -> list[tuple[str, Plan, str]]:
    plan = _plan("nop5")
    cases = [(w.name, with_site(plan, 0, w.site), w.reason)
             for w in wrong_sequences(plan.sites[0])]
    cross = _plan("nop5-pagecross")
    tramp = cross.sites[1].sequences.trampoline if cross.sites[1].sequences else None
    assert tramp is not None
    w = crossing_site(cross.sites[0], tramp)
    cases.append((w.name, with_site(cross, 0, w.site), w.reason))
    return cases


WRONG = _wrong_cases()


@pytest.mark.parametrize(("name", "plan", "reason"), WRONG, ids=[c[0] for c in WRONG])
def test_wrong_sequence_is_rejected_with_its_reason(name: str, plan: Plan, reason: str) -> None:
    image = load(str(fixture("nop5-pagecross" if name == "site-crosses-page" else "nop5"))).image
    rep = verify_plan(plan, image)
    v = rep.verdicts[0]
    assert v.status == FAIL and reason in v.codes
    assert not rep.ok
    if name != "site-crosses-page":
        # the emulator shows the damage too, not only the rule
        assert any(c.startswith("torn-state") for c in v.codes), v.codes
    assert all(o.status == PASS for o in rep.verdicts[1:] if o.protocol == "nop5")


def test_seven_wrong_sequences() -> None:
    assert sorted(c[2] for c in WRONG) == sorted([
        "no-int3-first", "opcode-before-displacement", "displacement-without-int3",
        "wrong-rel32", "site-crosses-page", "unoptimize-leaves-call", "write-spans-byte0"])


def test_cli_verify_rejects_a_wrong_plan_file(tmp_path: Path) -> None:
    _name, plan, reason = WRONG[0]
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(plan_json(plan)))
    r = run_cli("verify", fixture("nop5"), "--plan", path)
    assert r.rc == 1
    assert f"[{reason}]" in r.out and "FAIL" in r.out
    r = run_cli("verify", fixture("nop5"), "--plan", path, "--json")
    doc = json.loads(r.out)
    assert r.rc == 1 and doc["ok"] is False
    assert reason in [f["code"] for f in doc["sites"][0]["failures"]]


def test_cli_verify_passes_plan_output(tmp_path: Path) -> None:
    r = run_cli("plan", fixture("nop5"), "--json")
    path = tmp_path / "plan.json"
    path.write_text(r.out)
    r = run_cli("verify", fixture("nop5"), "--plan", path)
    assert r.rc == 0, r.out
    assert r.out.count("PASS") == 3
    # check's red-zone rule clears nop5's functions: no hazard, as check reports none
    assert "optimized-call-clobbers-red-zone" not in r.out
    r = run_cli("verify", fixture("nop5"), "--json")
    doc = json.loads(r.out)
    assert doc["schema"] == "usdtpatch/verification" and doc["ok"] is True
    assert doc["sites"][0]["red_zone_writes"] == list(range(-32, 0))


@pytest.mark.parametrize("content", ["not json", "{}", "[1, 2]"], ids=["text", "empty", "list"])
def test_cli_verify_bad_plan(tmp_path: Path, content: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    r = run_cli("verify", fixture("nop5"), "--plan", path)
    assert r.rc == 2 and "Traceback" not in r.err and r.err.count("\n") == 1
    # the line names the plan file, the one that is wrong, not FILE
    assert r.err.startswith(f"usdtpatch: {path}: ") and str(fixture("nop5")) not in r.err


def test_plan_for_another_file_is_rejected(tmp_path: Path) -> None:
    r = run_cli("plan", fixture("nop5"), "--json")
    path = tmp_path / "plan.json"
    path.write_text(r.out)
    r = run_cli("verify", fixture("nop5-alt"), "--plan", path)
    assert r.rc == 1 and "original-mismatch" in r.out


def test_claimed_guard_on_a_plain_site_is_rejected() -> None:
    plan = _plan("nop5")
    site = replace(plan.sites[0], guarded=True)
    v = verify_plan(with_site(plan, 0, site), load(str(fixture("nop5"))).image).verdicts[0]
    assert v.status == FAIL and "guarded-site-writes-red-zone" in v.codes


@pytest.mark.parametrize(("code", "failure"), [
    (NOP5_GEN.trampoline.replace(b"\x59\xc3", b"\x90\xc3"), "torn-state-faults"),
    (NOP5_GEN.trampoline.replace(b"\x58\x41\x5b\x59", b"\x58\x59\x41\x5b"),
     "torn-state-clobbers-registers"),
    (NOP5_GEN.trampoline.replace(b"\x41\x53\x50", b"\x50\x41\x53"), "hit-reports-wrong-registers"),
    (NOP5_GEN.trampoline.replace(b"\x0f\x05", b"\x90\x90"), "torn-state-misses-hit"),
], ids=["no-pop-rcx", "pops-swapped", "pushes-swapped", "no-syscall"])
def test_a_broken_trampoline_is_caught(code: bytes, failure: str) -> None:
    """The checker has teeth: a trampoline that is wrong in one way fails the site."""
    plan = _plan("nop5")
    image = load(str(fixture("nop5"))).image
    site = plan.sites[0]
    assert site.sequences is not None and site.sequences.trampoline is not None
    machine = Machine(image, plan.load_base, {site.sequences.trampoline: code})
    v = verify_site(machine, site, image, plan.load_base, {site.sequences.trampoline})
    assert v.status == FAIL and failure in v.codes, v.codes


GUARDED_SOURCE = (
    "#include <sys/sdt.h>\n"
    "volatile long v;\n"
    "__attribute__((noinline)) void f(long x) { STAP_PROBE1(g, site, x); v += x; }\n"
    "int main(void) { f(1); return 0; }\n")


@pytest.mark.needs_cc
def test_guarded_nop5_leaves_the_red_zone_alone(tmp_path: Path) -> None:
    """A site rewritten with the red-zone guard (pc on the nop5, between the two leas)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the guarded test program")
    (tmp_path / "g.c").write_text(GUARDED_SOURCE)
    done = subprocess.run(["gcc", "-O2", "-o", str(tmp_path / "g"), str(tmp_path / "g.c")],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot build the guarded program: {done.stderr[:200]}")
    from usdtpatch.analysis.forms import Guard
    from usdtpatch.elf.image import parse_elf
    from usdtpatch.rewriter.build import build_rewrite
    from usdtpatch.rewriter.plan import plan_rewrite

    rp = plan_rewrite(parse_elf((tmp_path / "g").read_bytes()), guard=Guard.ALWAYS,
                      verify=None)
    assert rp.changed and rp.sites[0].guarded
    (tmp_path / "g.rw").write_bytes(build_rewrite(rp))
    (tmp_path / "g.rw").chmod(0o755)
    plan = _plan(tmp_path / "g.rw")
    site = plan.sites[0]
    assert site.guarded and site.sequences is not None and site.sequences.original == NOP5
    v = verify_plan(plan, load(str(tmp_path / "g.rw")).image).verdicts[0]
    assert v.status == PASS and v.red_zone_writes == () and not v.hazards
    assert subprocess.run([str(tmp_path / "g.rw")], check=False).returncode == 0


@pytest.mark.needs_cc
def test_a_pc_on_the_guard_lea_is_not_a_guarded_site(tmp_path: Path) -> None:
    """With the pc on `lea -0x80(%rsp),%rsp` tracers would probe the lea, not the NOP: the
    kernel would never optimize it, so plan must not call it a guarded nop5."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    (tmp_path / "l.c").write_text(
        "#include <sys/sdt.h>\n#undef _SDT_NOP\n#define _SDT_NOP "
        ".byte 0x48; .byte 0x8d; .byte 0x64; .byte 0x24; .byte 0x80; "
        ".byte 0x0f; .byte 0x1f; .byte 0x44; .byte 0x00; .byte 0x00; "
        ".byte 0x48; .byte 0x8d; .byte 0xa4; .byte 0x24; .byte 0x80; .byte 0; .byte 0; .byte 0\n"
        "volatile long v;\n"
        "__attribute__((noinline)) void f(long x) { STAP_PROBE1(g, site, x); v += x; }\n"
        "int main(void) { f(1); return 0; }\n")
    done = subprocess.run(["gcc", "-O2", "-o", str(tmp_path / "l"), str(tmp_path / "l.c")],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot build: {done.stderr[:200]}")
    site = _plan(tmp_path / "l").sites[0]
    assert not site.guarded and site.sequences is not None and site.sequences.optimize is None


def test_summarize_for_the_demo() -> None:
    rc, text = summarize(str(fixture("nop5")))
    assert rc == 0
    assert "optimize:" in text and "3 pass, 0 fail" in text
