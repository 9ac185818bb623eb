"""The protocol lab (usdtpatch/sequences/protocols, `verify --protocol`): the shipped nop5 and nop10
protocol files give exactly the sequences `plan` gives and the same verify results on every
fixture; each wrong-sequence file is sequences/wrong.py's mutation, rejected with its own reason; a
state whose keystone encoding does not say what its text says is refused with the
difference shown, and so is every malformed file, in one line.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import keystone  # noqa: F401  (a dependency: missing is a broken install, not a skip)
import pytest

from usdtpatch import api
from usdtpatch.cli import main
from usdtpatch.errors import UsdtpatchError
from usdtpatch.sequences.plan import Plan
from usdtpatch.sequences.protocols import (
    ProtocolError,
    apply_protocol,
    assemble_state,
    load_protocol,
    shipped,
)
from usdtpatch.sequences.wrong import wrong_sequences

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "fixtures" / "bin"
WRONG = sorted(p.stem for p in shipped("wrong/x").parent.glob("*.toml"))


def _plans(form: str) -> list[tuple[str, Plan]]:
    out = []
    for f in sorted(BIN.iterdir()):
        try:
            out.append((f.name, api.plan(f, form=form)))
        except UsdtpatchError:
            continue  # not x86-64 ELF with probes: plan refuses it, nothing to compare
    return out


@pytest.mark.parametrize("form", ["nop5", "nop10"])
def test_shipped_protocol_reproduces_every_plan(form: str) -> None:
    proto = load_protocol(shipped(form))
    plans = _plans(form)
    optimized = 0
    for name, plan in plans:
        assert apply_protocol(plan, proto) == plan, name
        optimized += sum(1 for s in plan.sites
                         if s.sequences is not None and s.sequences.optimize is not None)
    assert len(plans) > 30 and optimized >= 6  # the comparison covered real work


def _verify_doc(args: list[str]) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    rc = main(["verify", "--json", *args], out, io.StringIO())
    doc: dict[str, Any] = json.loads(out.getvalue())
    doc.pop("seconds")
    return rc, doc


@pytest.mark.parametrize(("fixture", "form"), [
    ("nop5", "nop5"), ("nop5-alt", "nop5"), ("combo5", "nop5"), ("nop5-pageend", "nop5"),
    ("fork", "nop5"), ("nop10", "nop10"), ("combo10", "nop10")])
def test_shipped_protocol_reproduces_verify(fixture: str, form: str) -> None:
    path = str(BIN / fixture)
    rc, doc = _verify_doc([path, "--kernel", {"nop5": "6.18", "nop10": "nop10-series"}[form]])
    rc2, doc2 = _verify_doc([path, "--protocol", str(shipped(form))])
    assert (rc2, doc2) == (rc, doc)
    assert doc["runs"] > 0


def test_every_wrong_sequence_has_a_file() -> None:
    plan = api.plan(BIN / "nop5")
    site = next(s for s in plan.sites if s.sequences is not None and s.sequences.optimize)
    assert sorted(w.name for w in wrong_sequences(site)) == WRONG


@pytest.mark.parametrize("name", WRONG)
def test_wrong_sequence_file_is_the_mutation_and_is_rejected(name: str) -> None:
    plan = api.plan(BIN / "nop5")
    proto = load_protocol(shipped(f"wrong/{name}"))
    changed = apply_protocol(plan, proto)
    for site in plan.sites:
        want = next(w for w in wrong_sequences(site) if w.name == name)
        got = next(s for s in changed.sites if s.index == site.index)
        assert got.sequences == want.site.sequences
    rc, doc = _verify_doc([str(BIN / "nop5"), "--protocol", str(shipped(f"wrong/{name}"))])
    assert rc == 1 and not doc["ok"]
    for v in doc["sites"]:
        assert v["status"] == "fail"
        assert name in {f["code"] for f in v["failures"]}, v["failures"]


def test_wrong_sequences_fail_for_different_reasons() -> None:
    firsts = set()
    for name in WRONG:
        _, doc = _verify_doc([str(BIN / "nop5"), "--protocol", str(shipped(f"wrong/{name}"))])
        codes = {f["code"] for v in doc["sites"] for f in v["failures"]}
        assert name in codes
        firsts.add(frozenset(codes))
    assert len(firsts) == len(WRONG)


# --- keystone's encodings checked against their text -------------------------------------

NOP5_FILE = shipped("nop5").read_text()


def _variant(tmp_path: Path, old: str, new: str, name: str = "p.toml") -> Path:
    assert old in NOP5_FILE
    p = tmp_path / name
    p.write_text(NOP5_FILE.replace(old, new, 1))
    return p


def _refused(args: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    rc = main(["verify", *args], out, err)
    assert rc == 2 and out.getvalue() == "", (rc, out.getvalue())
    text = err.getvalue()
    assert text.count("\n") == 1 and "Traceback" not in text, text
    return text


def test_keystone_misencoded_nop_is_refused_with_the_difference(tmp_path: Path) -> None:
    # keystone assembles the canonical nop5's text into 0f 18 24 00: 4 bytes, prefetch space
    p = _variant(tmp_path, 'original = "{site}"', 'original = "nopl 0x0(%rax,%rax,1)"')
    text = _refused([str(BIN / "nop5"), "--protocol", str(p)])
    assert "nopl 0x0(%rax,%rax,1)" in text and "0f 18 24 00" in text
    assert "not a NOP opcode" in text and "capstone reads as `nopl (%rax, %rax)`" in text


def test_keystone_hint_space_with_displacement_is_refused(tmp_path: Path) -> None:
    p = _variant(tmp_path, 'original = "{site}"', 'original = "nopl 0x1(%rax,%rax,1)"')
    text = _refused([str(BIN / "nop5"), "--protocol", str(p)])
    assert "0f 18 64 00 01" in text and "not a NOP opcode" in text


def test_a_correct_assembly_text_is_accepted() -> None:
    proto = load_protocol(shipped("nop10"))
    enc = assemble_state(proto, "call", 0x1000, bytes(10), 0x3000)
    assert enc == bytes.fromhex("488d642480e8") + (0x3000 - 0x100A).to_bytes(4, "little")


def test_a_state_of_the_wrong_length_is_refused(tmp_path: Path) -> None:
    p = _variant(tmp_path, 'int3 = "int3; {site[1:5]}"', 'int3 = "int3"')
    text = _refused([str(BIN / "nop5"), "--protocol", str(p)])
    assert "state int3" in text and "1 bytes (cc), the site is 5" in text


def test_a_different_instruction_is_refused(tmp_path: Path) -> None:
    # keystone encodes `xchg %ax, %ax` as 66 90, which is `nop`
    proto = load_protocol(_variant(tmp_path, 'int3 = "int3; {site[1:5]}"',
                                   'int3 = "xchg %ax, %ax; {site[2:5]}"'))
    with pytest.raises(ProtocolError, match=r"66 90 .*`nop`.*a different instruction"):
        apply_protocol(api.plan(BIN / "nop5"), proto)


def test_a_faithful_but_wrong_protocol_is_verify_s_business(tmp_path: Path) -> None:
    """`jmp` says what its text says (e9 rel32): assembled, then rejected by verify."""
    p = _variant(tmp_path, 'call = "call {trampoline}"', 'call = "jmp {trampoline}"')
    rc, doc = _verify_doc([str(BIN / "nop5"), "--protocol", str(p)])
    assert rc == 1
    assert all("optimize-end-not-call" in {f["code"] for f in v["failures"]}
               for v in doc["sites"])


@pytest.mark.parametrize(("old", "new", "says"), [
    ('name = "nop5"', 'name = ""', "missing name"),
    ('model = "nop5"', 'model = "nop7"', "model must be"),
    ('start = "int3"', 'start = "nowhere"', "no state 'nowhere'"),
    ('{ write = "call[1:5]"', '{ write = "call[1:9]"', "leaves the 5-byte site"),
    ('{ write = "call[1:5]"', '{ write = "call(1:5)"', "is not STATE[a:b]"),
    ('expect = "call[0]"', 'expect = "call[0:2]"', "is not one byte"),
    ('call = "call {trampoline}"', 'call = "call {nowhere}"', "unknown placeholder"),
    ('call = "call {trampoline}"', 'call = "frobnicate %rax"', "cannot assemble"),
    ("[sequences.detach]", "[sequences.detachx]", "unknown sequence"),
    ("[sequences.unoptimize]", "[sequences.attachx]", "unknown sequence"),
    ('name = "nop5"', 'name = "nop5', "not a TOML protocol file"),
])
def test_malformed_protocol_files_are_one_line(tmp_path: Path, old: str, new: str,
                                               says: str) -> None:
    p = _variant(tmp_path, old, new)
    text = _refused([str(BIN / "nop5"), "--protocol", str(p)])
    assert says in text and text.startswith(f"usdtpatch: {p}: ")


def test_missing_protocol_file_and_plan_with_protocol(tmp_path: Path) -> None:
    assert "no such file" in _refused([str(BIN / "nop5"), "--protocol",
                                       str(tmp_path / "none.toml")])
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    assert "not both" in _refused([str(BIN / "nop5"), "--plan", str(plan), "--protocol",
                                   str(shipped("nop5"))])


def test_each_error_line_names_the_file_it_is_about(tmp_path: Path) -> None:
    """The protocol file for its own errors (read, or assembled at FILE's sites), FILE for
    FILE's: never `usdtpatch: FILE: PROTOCOL: ...`."""
    elf = str(BIN / "nop5")

    def about(path: Path, args: list[str]) -> str:
        text = _refused(args)
        assert text.startswith(f"usdtpatch: {path}: "), text
        assert text.count(str(path)) == 1 and elf not in text, text
        return text

    broken = _variant(tmp_path, 'name = "nop5"', 'name = "nop5', "broken.toml")
    assert "not a TOML protocol file" in about(broken, [elf, "--protocol", str(broken)])
    missing = tmp_path / "none.toml"
    assert about(missing, [elf, "--protocol", str(missing)]).endswith(": no such file\n")
    short = _variant(tmp_path, 'int3 = "int3; {site[1:5]}"', 'int3 = "int3"', "short.toml")
    assert "the site is 5" in about(short, [elf, "--protocol", str(short)])
    prog = tmp_path / "prog"  # FILE missing, the protocol fine: FILE's error
    text = about(prog, [str(prog), "--protocol", str(shipped("nop5"))])
    assert "nop5.toml" not in text
