"""One engine for the kernel's rules (usdtpatch.analysis.rules): check, plan, verify and rewrite
get their verdict from it, so they agree on every site.

- pure property test: for many byte patterns, addresses around page ends, both bitnesses and
  reach or not, plan's refusals (sequences.sequences) name exactly the engine's code
  and accept exactly what the engine accepts;
- end to end: fixtures with each pattern written at every probe's pc, then `check` (its
  verdict matrix) and `plan` (its per-site sequences and findings) side by side;
- verify fails a plan that optimizes a site the engine refuses, with the engine's code;
- the rules' own facts, each with inputs they must accept and must reject.
"""

from __future__ import annotations

import itertools
import random
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import NOP5_GEN, NOP10_GEN, fixture
from usdtpatch.analysis.check import check
from usdtpatch.analysis.probes import read_probes
from usdtpatch.analysis.rules import (
    Outcome,
    Reach,
    optimized_where_it_is,
    rule,
    unprobeable,
)
from usdtpatch.elf.image import parse_elf
from usdtpatch.sequences.plan import build_plan, with_site
from usdtpatch.sequences.sequences import (
    PROTOCOL_INT3,
    optimized_sequences,
    probeable_refusal,
    refusal,
)
from usdtpatch.sequences.trampoline import default_load_base
from usdtpatch.verification.plans import FAIL, verify_plan
from usdtpatch.x86.nops import NOP5, NOP10, SiteForm, classify_site, kernel_optimizable_nop5

# What can sit at a probe's pc: every NOP shape the rules tell apart, and some non-NOPs.
PATTERNS = [bytes.fromhex(h) for h in (
    "0f1f440000",  # canonical nop5
    "0f1f400000" "00", "660f1f4000", "666666660f1f00", "66666690" "90",  # nop5-alt shapes
    "0f1f00", "0f1f4000", "0f1f8000000000", "660f1f840000000000",  # NOPs of other lengths
    "90", "6690", "f390",  # nop1, 2-byte nop, pause
    "0f1f4c0000", "0f1f480000", "0f1f7c0000",  # hint NOPs (ModRM.reg != 0)
    "3e0f1f440000", "2e0f1f440000", "3e90", "2e660f1f840000000000",  # CS/DS prefixed
    "262e0f1f4400", "640f1f440000",  # ES then CS; FS (probeable, another length)
    "900f1f440000",  # combo5
    "90662e0f1f840000000000",  # combo10
    "66662e0f1f840000000000",  # a nop10 with one more prefix
    "4889e5", "c3", "e800000000", "cc", "0f0b",  # not NOPs
    "480f1f440000",  # REX.W nop5 (6 bytes)
)]


def _const(value: bool) -> Reach:
    def reach(_end: int) -> bool:
        return value
    return reach


def _random_patterns(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    heads = [b"", b"\x66", b"\x3e", b"\x2e", b"\x0f\x1f", b"\x90", b"\x66\x2e\x0f\x1f\x84"]
    return [rng.choice(heads) + rng.randbytes(12) for _ in range(n)]


ADDRESSES = [0x1000, 0x1ffa, 0x1ffb, 0x1ffc, 0x1fff, 0x2ff6, 0x2ff7, 0x7fff_0010]


# -- the pure property: plan's refusals are the engine's verdicts -----------------------------

@pytest.mark.parametrize("is64", [True, False], ids=["64-bit", "32-bit"])
def test_plan_refusals_are_the_engines_verdicts(is64: bool) -> None:
    seen: set[tuple[str, str | None]] = set()
    for code, address in itertools.product(PATTERNS + _random_patterns(400), ADDRESSES):
        for tramp in (address - 0x10000, None, address + 5 + (1 << 31)):
            reach = tramp is not None and abs(tramp - (address + 5)) < (1 << 31)
            v = rule(NOP5_GEN, code, address, is64=is64, reach=_const(reach))
            f = refusal(NOP5_GEN, address, code, tramp, is64, "p:n")
            want = None if v.outcome.optimized else v.code
            assert (f.code if f else None) == want, (code.hex(), hex(address), tramp, v)
            p = probeable_refusal(code, "p:n")
            assert (p is not None) == (v.outcome is Outcome.UNPROBEABLE), code.hex()
            if p is not None:
                assert p.code == v.code
            reach10 = tramp is not None and abs(tramp - (address + 10)) < (1 << 31)
            v10 = rule(NOP10_GEN, code, address, is64=is64, reach=_const(reach10))
            f10 = refusal(NOP10_GEN, address, code, tramp, is64, "p:n")
            assert (f10.code if f10 else None) == (None if v10.outcome.optimized else v10.code)
            seen.add(("618", v.code))
            seen.add(("nop10", v10.code))
    # the sweep reached every verdict it is meant to compare
    want618 = {None, "site-segment-prefix", "site-hint-nop", "site-not-nop5",
               "site-crosses-page", "no-trampoline-reach"} if is64 else \
        {"site-elf32", "site-segment-prefix"}
    assert {c for k, c in seen if k == "618"} == want618
    if is64:
        assert {c for k, c in seen if k == "nop10"} >= {None, "site-not-nop10",
                                                         "site-crosses-page",
                                                         "site-segment-prefix",
                                                         "no-trampoline-reach"}


def test_site_form_classifier_agrees_with_the_engine() -> None:
    # x86.nops (below the engine) names a site `nop5`/`nop5-alt` by kernel_optimizable_nop5;
    # the forms rewrite keeps as they are must be exactly the ones the engine optimizes
    for code in PATTERNS + _random_patterns(2000, seed=11):
        engine = rule(NOP5_GEN, code, 0x1000).outcome is Outcome.OPTIMIZED
        assert kernel_optimizable_nop5(code) == engine, code.hex()
        form = classify_site(code + bytes(16)).form
        if form in (SiteForm.NOP5, SiteForm.NOP5_ALT):
            assert engine, code.hex()


# -- end to end: check and plan on the same bytes ----------------------------------------------

def _patched(name: str, pattern: bytes, tmp: Path) -> Path:
    """Fixture `name` with `pattern` written at every probe's pc (in the file)."""
    data = bytearray(fixture(name).read_bytes())
    ps = read_probes(parse_elf(bytes(data)))
    for p in ps.probes:
        assert p.offset is not None
        data[p.offset:p.offset + len(pattern)] = pattern
    out = tmp / f"{name}-{pattern.hex()}"
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("name", ["pie", "nop5-pagecross", "i386"])
def test_check_and_plan_agree_on_every_site(name: str, tmp_path: Path) -> None:
    compared = 0
    for pattern in PATTERNS:
        path = _patched(name, pattern, tmp_path)
        ps = read_probes(parse_elf(path.read_bytes()))
        rep = check(ps)
        for protocol in ("nop5", "nop10"):
            plan = build_plan(ps, str(path), protocol, default_load_base(ps.image))
            by_probe = {s.probe: s for s in plan.sites}
            for sc in rep.sites:
                site = by_probe[sc.probe.probe_id]
                v = sc.candidacy.verdict(NOP5_GEN) if protocol == "nop5" else \
                    sc.candidacy.verdict(NOP10_GEN)
                codes = [f.code for f in site.findings
                         if f.code != "optimized-call-clobbers-red-zone"]
                label = (pattern.hex(), protocol, sc.probe.probe_id, v, codes)
                if v.outcome is Outcome.UNPROBEABLE:
                    assert site.sequences is None and codes == [v.code], label
                elif v.outcome.optimized:
                    assert site.sequences is not None, label
                    assert site.sequences.protocol == protocol and not codes, label
                else:
                    assert site.sequences is not None, label
                    assert site.sequences.protocol == PROTOCOL_INT3, label
                    assert codes == [v.code], label
                compared += 1
    assert compared >= len(PATTERNS) * 2


# -- verify asks the same engine ----------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "code"), [
    (bytes.fromhex("0f1f4c0000"), "site-hint-nop"),
    (bytes.fromhex("660f1f440000")[:5], "site-not-nop5"),  # 66 0f 1f 44 00: a 6-byte NOP
])
def test_verification_fails_an_optimized_site_the_engine_refuses(pattern: bytes, code: str,
                                                           tmp_path: Path) -> None:
    path = _patched("pie", pattern, tmp_path)
    image = parse_elf(path.read_bytes())
    ps = read_probes(image)
    plan = build_plan(ps, str(path), "nop5", default_load_base(image))
    site = plan.sites[0]
    assert site.sequences is not None and site.sequences.protocol == PROTOCOL_INT3
    assert rule(NOP5_GEN, site.sequences.original, site.address).code == code
    tramp = site.address - 0x200000 & ~0xFFF
    forced = replace(site, sequences=optimized_sequences(NOP5_GEN, site.address,
                                                         site.sequences.original, tramp))
    rep = verify_plan(with_site(plan, 0, forced), image)
    v = rep.verdicts[0]
    assert v.status == FAIL and code in v.codes, v


def test_verification_accepts_what_the_engine_accepts() -> None:
    image = parse_elf(fixture("nop5").read_bytes())
    plan = build_plan(read_probes(image), "nop5", "nop5", default_load_base(image))
    rep = verify_plan(plan, image)
    optimized = [v for s, v in zip(plan.sites, rep.verdicts, strict=True)
                 if s.sequences is not None and s.sequences.optimize is not None]
    assert optimized and all(not set(v.codes) & {"site-hint-nop", "site-not-nop5",
                                                  "site-crosses-page"} for v in optimized)


# -- the rules' facts, accepted and rejected ------------------------------------------------------

def test_page_rule_is_x86_nops_crosses_page() -> None:
    assert rule(NOP5_GEN, NOP5, 0x1000 + 4091).outcome is Outcome.OPTIMIZED
    assert rule(NOP5_GEN, NOP5, 0x1000 + 4092).code == "site-crosses-page"
    assert rule(NOP10_GEN, NOP10, 0x1000 + 4086).outcome is Outcome.OPTIMIZED
    assert rule(NOP10_GEN, NOP10, 0x1000 + 4087).code == "site-crosses-page"


def test_segment_prefix_comes_before_bitness() -> None:
    ds = bytes.fromhex("3e0f1f4000")
    assert rule(NOP5_GEN, ds, 0x1000, is64=False).code == "site-segment-prefix"
    assert rule(NOP5_GEN, NOP5, 0x1000, is64=False).code == "site-elf32"
    assert unprobeable(ds) is not None and unprobeable(NOP5) is None


def test_nop10_series_is_kept_apart() -> None:
    # the unreleased series optimizes the CS-prefixed nop10 6.18 refuses, and no nop5
    assert rule(NOP5_GEN, NOP10, 0x1000).outcome is Outcome.UNPROBEABLE
    assert rule(NOP10_GEN, NOP10, 0x1000).outcome is Outcome.OPTIMIZED
    assert rule(NOP10_GEN, NOP5, 0x1000).code == "site-not-nop10"
    assert rule(NOP10_GEN, NOP10, 0x1000, is64=False).code == "site-elf32"


def test_combo5_is_optimized_at_the_next_byte_only() -> None:
    v = rule(NOP5_GEN, NOP5, 0x1001, at_next=True)
    assert v.outcome is Outcome.OPTIMIZED_AT_NEXT and v.code == "site-combo5-pc1"
    assert rule(NOP5_GEN, b"\x90" + NOP5, 0x1000).code == "site-not-nop5"


def test_rewrite_question() -> None:
    assert optimized_where_it_is(NOP5, 0x4000)
    assert not optimized_where_it_is(NOP5, 0x4ffd)
    assert not optimized_where_it_is(bytes.fromhex("0f1f4c0000"), 0x4000)
    assert optimized_where_it_is(NOP10, 0x4ff6, NOP10_GEN)
    assert not optimized_where_it_is(NOP10, 0x4ff7, NOP10_GEN)
    assert not optimized_where_it_is(NOP5, 0x4000, NOP10_GEN)


def test_patched_fixture_helper_writes_the_pattern(tmp_path: Path) -> None:
    path = _patched("pie", bytes.fromhex("0f1f4c0000"), tmp_path)
    ps = read_probes(parse_elf(path.read_bytes()))
    assert ps.probes and all(p.code.startswith(bytes.fromhex("0f1f4c0000")) for p in ps.probes)
    assert struct.unpack_from("<I", path.read_bytes(), 0)[0] == 0x464C457F
