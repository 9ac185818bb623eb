"""`usdtpatch rewrite` on every runnable fixture, with each form and red-zone guard.

Issue 5, "done when": the rewritten file runs and prints exactly what the original prints
(stdout and exit status); binutils `readelf -n`, LIEF, gdb `info probes` and bcc's `tplist`
list the moved probes at their new pcs; `restore` gives the original back byte for byte;
rewriting a rewritten file is a no-op; the input file is never modified.

The fixtures are only read: every output goes to a temporary directory. libprobes.so is
rewritten next to a copy of `uses-shared` (rpath $ORIGIN, LD_LIBRARY_PATH as well).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import fixture, fixture_files, readelf_sdt_notes, run_cli
from usdtpatch.analysis.forms import Form
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.marker import MARKER_SECTION

# not runnable here (foreign architecture, 32-bit), or made to be rejected, or a library, or
# without a probe (rewrite -o writes nothing for it: tests/test_cli_conventions.py)
NOT_RUNNABLE = {"i386", "aarch64", "bigendian", "odd-note", "bad-args", "libprobes.so",
                "noprobes"}
RUNNABLE = [p.name for p in fixture_files() if p.name not in NOT_RUNNABLE]
FORMS = [f.value for f in Form]
GUARDS = ["auto", "always", "never"]
REWRITTEN = ("detour", "moved", "in-place")
SITE_BYTES = {"nop5": bytes.fromhex("0f1f440000"), "combo5": bytes.fromhex("900f1f440000"),
              "combo10": bytes.fromhex("90662e0f1f840000000000")}

pytestmark = pytest.mark.skipif(not RUNNABLE, reason="fixtures/bin holds no fixtures yet")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Output:
    """One rewrite: where its input and output are, how to run it, the report entry."""

    name: str
    source: Path  # the fixture rewritten (libprobes.so for uses-shared)
    out: Path  # the rewritten file
    exe: Path  # what to run
    rc: int
    report: dict[str, Any]


def _run(exe: Path) -> tuple[int, bytes]:
    env = dict(os.environ, LD_LIBRARY_PATH=str(exe.parent))
    done = subprocess.run([str(exe)], capture_output=True, timeout=30, env=env, check=False)
    return done.returncode, done.stdout


_REFERENCE: dict[str, tuple[int, bytes]] = {}


def reference(name: str) -> tuple[int, bytes]:
    if name not in _REFERENCE:
        _REFERENCE[name] = _run(fixture(name))
    return _REFERENCE[name]


def rewrite(name: str, form: str, guard: str, d: Path) -> Output:
    """Rewrite fixture `name` (or its library) into `d` through the CLI; check the input is
    untouched."""
    d.mkdir(parents=True, exist_ok=True)
    if name == "uses-shared":
        shutil.copy2(fixture(name), d / name)
        source, out, exe = fixture("libprobes.so"), d / "libprobes.so", d / name
    else:
        source, out = fixture(name), d / name
        exe = out
    before = _sha(source)
    res = run_cli("rewrite", source, "-o", out, "--form", form, "--redzone-guard", guard,
                  "--json")
    assert _sha(source) == before, "the input file was modified"
    assert res.rc in (0, 1), res.err
    doc = json.loads(res.out)
    assert not doc["errors"] and len(doc["files"]) == 1
    assert os.stat(out).st_mode == os.stat(source).st_mode  # mode bits kept
    return Output(name, source, out, exe, res.rc, doc["files"][0])


_CACHE: dict[tuple[str, str, str], Output] = {}


@pytest.fixture(scope="module")
def outdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rewritten")


def cached(name: str, form: str, guard: str, outdir: Path) -> Output:
    key = (name, form, guard)
    if key not in _CACHE:
        _CACHE[key] = rewrite(name, form, guard, outdir / f"{name}.{form}.{guard}")
    return _CACHE[key]


# The default (nop5, auto) of every fixture runs in the quick loop; the other forms and
# guards are marked slow (the whole matrix takes about 12 s; `make test` runs it).
MATRIX = [pytest.param(n, f, g, id=f"{n}-{f}-{g}",
                       marks=() if (f, g) == ("nop5", "auto") else pytest.mark.slow)
          for n in RUNNABLE for f in FORMS for g in GUARDS]


@pytest.mark.parametrize(("name", "form", "guard"), MATRIX)
def test_rewritten_fixture_runs_like_original(name: str, form: str, guard: str,
                                              outdir: Path) -> None:
    o = cached(name, form, guard, outdir)
    sites = o.report["sites"]
    # every skipped site names its reason; a failed one makes the exit status 1
    for s in sites:
        assert (s["action"] == "skipped") == (s["code"] is not None), s
        assert s["reason"], s
    failed = any(s["code"] in ("verification-failed", "relocation-failed") for s in sites)
    assert o.rc == (1 if failed else 0)
    assert _run(o.exe) == reference(name)

    original = o.source.read_bytes()
    data = o.out.read_bytes()
    if not o.report["changed"]:
        assert data == original
        assert not any(s["action"] in REWRITTEN for s in sites)
        return
    # restore gives the original back, byte for byte
    restored = o.out.parent / "restored"
    res = run_cli("restore", o.out, "-o", restored)
    assert res.rc == 0, res.err
    assert restored.read_bytes() == original
    # rewriting a rewritten file is a no-op
    again = o.out.parent / "again"
    res = run_cli("rewrite", o.out, "-o", again, "--form", form, "--redzone-guard", guard,
                  "--json")
    assert res.rc == 0, res.err
    assert again.read_bytes() == data
    assert not json.loads(res.out)["files"][0]["changed"]


def _expected_pcs(o: Output) -> list[tuple[str, str, int]]:
    """(provider, name, note pc) the rewritten file must list: the original note pc moved by
    as much as the report moved the site."""
    before = readelf_sdt_notes(o.source)
    sites = o.report["sites"]
    assert [(n.provider, n.name) for n in before] == [(s["provider"], s["name"]) for s in sites]
    out = []
    for n, s in zip(before, sites, strict=True):
        moved = s["new_pc"] - s["address"] if s["action"] in REWRITTEN else 0
        out.append((n.provider, n.name, n.pc + moved))
    return out


def _site_bytes_ok(o: Output, form: str) -> None:
    """At each rewritten site's new pc the file holds the form's bytes."""
    image = parse_elf(o.out.read_bytes())
    for s in o.report["sites"]:
        if s["action"] in ("detour", "moved"):
            want = SITE_BYTES[form]
            assert image.read_vaddr(s["new_pc"], len(want)) == want, s


def _lief_pcs(path: Path) -> list[int]:
    import lief

    binary = lief.parse(str(path))
    assert isinstance(binary, lief.ELF.Binary)
    pcs = []
    for note in binary.notes:
        if isinstance(note, lief.ELF.Note) and note.type == lief.ELF.Note.TYPE.STAPSDT:
            pcs.append(int.from_bytes(bytes(note.description[:8]), "little"))
    return pcs


def _gdb_pcs(path: Path) -> list[tuple[str, str, int]]:
    text = subprocess.run(["gdb", "-nx", "-batch", "-ex", "info probes", str(path)],
                          capture_output=True, text=True, timeout=60, check=False).stdout
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "stap":
            out.append((parts[1], parts[2], int(parts[3], 16)))
    return out


def _tplist_pcs(path: Path) -> list[tuple[str, str, int]]:
    text = subprocess.run(["tplist-bpfcc", "-vv", "-l", str(path)], capture_output=True,
                          text=True, timeout=60, check=False).stdout
    out = []
    probe: tuple[str, str] | None = None
    for line in text.splitlines():
        if not line.startswith(" ") and " [sema " in line:
            prov, name = line.split()[0].split(":", 1)
            probe = (prov, name)
        elif line.strip().startswith("location #") and probe is not None:
            out.append((probe[0], probe[1], int(line.split()[-1], 16)))
    return out


def _consumers() -> list[str]:
    have = []
    for tool in ("readelf", "gdb", "tplist-bpfcc"):
        if shutil.which(tool):
            have.append(tool)
    return have


CONSUMER_CASES = [(n, "nop5", "auto") for n in RUNNABLE] + \
    [("pie", f, g) for f in ("combo5", "combo10") for g in GUARDS] + \
    [("args-clang", "nop5", g) for g in ("always", "never")]


# gdb and tplist per case (7-8 s in all): pie's default case stays in the quick loop
@pytest.mark.parametrize(("name", "form", "guard"), [
    pytest.param(n, f, g, id=f"{n}-{f}-{g}",
                 marks=() if (n, f, g) == ("pie", "nop5", "auto") else pytest.mark.slow)
    for n, f, g in CONSUMER_CASES])
def test_consumers_read_moved_probes(name: str, form: str, guard: str, outdir: Path) -> None:
    o = cached(name, form, guard, outdir)
    if not o.report["changed"]:
        pytest.skip(f"{name}: nothing rewritten with --form {form} ({o.report['counts']})")
    want = _expected_pcs(o)
    _site_bytes_ok(o, form)
    notes = readelf_sdt_notes(o.out)
    assert [(n.provider, n.name, n.pc) for n in notes] == want
    before = {(n.provider, n.name): n for n in readelf_sdt_notes(o.source)}
    for n, s in zip(notes, o.report["sites"], strict=True):
        b = before[(n.provider, n.name)]
        assert (n.base, n.semaphore) == (b.base, b.semaphore)
        if not s["guarded"]:
            assert n.args == b.args
    assert sorted(_lief_pcs(o.out)) == sorted(pc for _, _, pc in want)
    # gdb applies the .stapsdt.base adjustment, bcc does not (it rejects prelinked pcs):
    # each must list on the rewritten file what it lists on the original, moved with the site
    delta: dict[int, int] = {}
    for (_, _, pc), s in zip(want, o.report["sites"], strict=True):
        moved = s["new_pc"] - s["address"] if s["action"] in REWRITTEN else 0
        delta[s["address"]] = delta[pc - moved] = moved
    for tool, read in (("gdb", _gdb_pcs), ("tplist-bpfcc", _tplist_pcs)):
        if tool not in _consumers():
            continue
        expect = sorted((p, n, pc + delta[pc]) for p, n, pc in read(o.source))
        assert sorted(read(o.out)) == expect, tool


def test_guarded_args_move_by_128(outdir: Path) -> None:
    """A guarded site's rsp-relative arguments are 128 bytes further from the lowered rsp;
    unguarded ones keep theirs (args-clang has N(%rsp) operands)."""
    always = cached("args-clang", "nop5", "always", outdir)
    never = cached("args-clang", "nop5", "never", outdir)
    orig = {(n.provider, n.name): n.args for n in readelf_sdt_notes(fixture("args-clang"))}
    seen = 0
    for n in readelf_sdt_notes(always.out):
        site = next(s for s in always.report["sites"] if s["name"] == n.name)
        if site["guarded"] and "(%rsp)" in orig[(n.provider, n.name)]:
            assert n.args != orig[(n.provider, n.name)]
            for a, b in zip(orig[(n.provider, n.name)].split(), n.args.split(), strict=True):
                if a.endswith("(%rsp)"):
                    da = a.split("@")[1].split("(")[0] or "0"
                    db = b.split("@")[1].split("(")[0]
                    assert int(db, 0) == int(da, 0) + 128
                    seen += 1
    assert seen, "no guarded rsp-relative argument in args-clang"
    assert [n.args for n in readelf_sdt_notes(never.out)] == list(orig.values())


def test_input_untouched_and_output_is_new(tmp_path: Path) -> None:
    """-o next to the input: the input keeps its bytes, inode and mtime."""
    src = tmp_path / "pie"
    shutil.copy2(fixture("pie"), src)
    st = os.stat(src)
    data = src.read_bytes()
    res = run_cli("rewrite", src, "-o", tmp_path / "out")
    assert res.rc == 0, res.err
    st2 = os.stat(src)
    assert (st2.st_ino, st2.st_mtime_ns, src.read_bytes()) == (st.st_ino, st.st_mtime_ns, data)
    assert (tmp_path / "out").read_bytes() != data
    assert parse_elf((tmp_path / "out").read_bytes()).section(MARKER_SECTION) is not None


def test_restore_refuses_a_changed_file(tmp_path: Path) -> None:
    """restore checks the original's sha256: a byte changed after the rewrite is refused."""
    out = tmp_path / "pie"
    assert run_cli("rewrite", fixture("pie"), "-o", out).rc == 0
    data = bytearray(out.read_bytes())
    image = parse_elf(bytes(data))
    text = image.section(".text")
    assert text is not None
    data[text.offset + 3] ^= 0xFF
    out.write_bytes(bytes(data))
    res = run_cli("restore", out, "-o", tmp_path / "back")
    assert res.rc == 2 and "sha256" in res.err
    assert not (tmp_path / "back").exists()


def test_restore_refuses_a_file_never_rewritten(tmp_path: Path) -> None:
    res = run_cli("restore", fixture("pie"), "-o", tmp_path / "back")
    assert res.rc == 2 and "not rewritten" in res.err


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "pie"
    shutil.copy2(fixture("pie"), src)
    before = _sha(src)
    res = run_cli("rewrite", src, "--dry-run", "--json")
    assert res.rc == 0, res.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pie"]
    assert _sha(src) == before
    doc = json.loads(res.out)["files"][0]
    assert doc["output"] is None and doc["counts"].get("detour", 0) == 3


def test_in_place_and_restore_in_place(tmp_path: Path) -> None:
    src = tmp_path / "pie"
    shutil.copy2(fixture("pie"), src)
    original = src.read_bytes()
    assert run_cli("rewrite", src, "--in-place").rc == 0
    assert src.read_bytes() != original
    assert _run(src) == reference("pie")
    assert run_cli("restore", src, "--in-place").rc == 0
    assert src.read_bytes() == original


def test_several_files_with_jobs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    names = ["pie", "nopie", "redzone-leaf"]
    res = run_cli("rewrite", *(fixture(n) for n in names), "-o", out, "-j", "2", "--json")
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert sorted(Path(f["path"]).name for f in doc["files"]) == sorted(names)
    for n in names:
        assert _run(out / n) == reference(n)
    # -o must be a directory with several inputs
    bad = run_cli("rewrite", fixture("pie"), fixture("nopie"), "-o", tmp_path / "nodir")
    assert bad.rc == 2 and "directory" in bad.err
