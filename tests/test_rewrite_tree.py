"""`usdtpatch rewrite --tree DIR` (usdtpatch/integrate/tree.py, docs/distributions.md): every ELF
file with probes under an install root, in place, in parallel; files without probes untouched
(bytes and mtime); symbolic links never followed; hard links rewritten once; the same bytes run
after run; a second run changes nothing; a tree that cannot be written is refused whole."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import fixture, run_cli
from usdtpatch import api
from usdtpatch.x86.nops import SiteForm


def state(root: Path) -> dict[str, tuple[str, int, int]]:
    """sha256, mtime (ns) and inode of every regular file under `root` (links not followed)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            out[str(p.relative_to(root))] = (hashlib.sha256(p.read_bytes()).hexdigest(),
                                             st.st_mtime_ns, st.st_ino)
    return out


def forms(path: Path) -> set[SiteForm]:
    return {p.site.form for p in api.load(path).probes}


def build_id_of(path: Path) -> str | None:
    from usdtpatch.elf.image import parse_elf
    from usdtpatch.elf.notes import build_id

    image = parse_elf(path.read_bytes())
    sec = image.section(".note.gnu.build-id")
    return None if sec is None else build_id(image.section_data(sec))


def staged(tmp: Path, name: str = "tree") -> Path:
    """An install root: two files with probes (one with a second hard link), a file that
    already has 5-byte sites, an ELF file without probes, a text file, and symbolic links
    (to a file in the tree, and to a file with probes outside it)."""
    root = tmp / name
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/lib").mkdir(parents=True)
    shutil.copy2(fixture("demo"), root / "usr/bin/demo")
    os.link(root / "usr/bin/demo", root / "usr/lib/demo-again")
    shutil.copy2(fixture("libprobes.so"), root / "usr/lib/libprobes.so")
    shutil.copy2(fixture("nop5"), root / "usr/bin/nop5")
    shutil.copy2(fixture("noprobes"), root / "usr/bin/noprobes")
    (root / "usr/README").write_text("not ELF\n")
    (root / "usr/bin/demo-link").symlink_to("demo")
    outside = tmp / f"{name}-outside"
    shutil.copy2(fixture("demo"), outside)
    (root / "usr/bin/outside").symlink_to(outside)
    (root / "usr/lib/dirlink").symlink_to(tmp / f"{name}-outdir")
    (tmp / f"{name}-outdir").mkdir()
    shutil.copy2(fixture("demo"), tmp / f"{name}-outdir" / "demo")
    return root


def test_tree_rewrites_the_files_with_probes_and_nothing_else(tmp_path: Path) -> None:
    root = staged(tmp_path)
    before = state(root)
    outside = {p: state(p.parent)[p.name] for p in (tmp_path / "tree-outside",
                                                    tmp_path / "tree-outdir" / "demo")}
    res = run_cli("rewrite", "--tree", root, "-j", "2")
    assert res.rc == 0, res.err
    after = state(root)
    changed = {k for k in before if before[k][:2] != after[k][:2]}
    assert changed == {"usr/bin/demo", "usr/lib/demo-again", "usr/lib/libprobes.so"}
    for name in ("usr/bin/demo", "usr/lib/libprobes.so"):
        assert forms(root / name) == {SiteForm.NOP5}, name
    # the hard links are still one file, rewritten once
    assert after["usr/bin/demo"][2] == after["usr/lib/demo-again"][2]
    assert "also its hard links" in res.out and str(root / "usr/lib/demo-again") in res.out
    # untouched: the links out of the tree and what they point to
    assert {p: state(p.parent)[p.name] for p in outside} == outside
    assert (root / "usr/bin/demo-link").is_symlink()
    assert "5 regular files, 4 ELF, 3 with probes: 2 rewritten, 1 unchanged" in res.out
    assert "(form nop5, the one the nop5 generation optimizes (--form auto, --kernel nop5), " \
           "-j 2, " in res.out
    # the rewritten program runs as the original
    ran = [subprocess.run([p], capture_output=True, timeout=30, check=False)
           for p in (fixture("demo"), root / "usr/bin/demo")]
    assert (ran[0].returncode, ran[0].stdout) == (ran[1].returncode, ran[1].stdout)


def test_tree_summary_counts_one_file_in_the_singular(tmp_path: Path) -> None:
    """"1 regular files": the summary's count of one is singular."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy2(fixture("demo"), root / "demo")
    res = run_cli("rewrite", "--tree", root, "--dry-run")
    assert res.rc == 0, res.err
    assert f"tree {root}: 1 regular file, 1 ELF, 1 with probes: " in res.out


def test_tree_is_the_same_run_after_run_and_a_second_run_changes_nothing(
        tmp_path: Path) -> None:
    one, two = staged(tmp_path, "one"), staged(tmp_path, "two")
    assert run_cli("rewrite", "--tree", one, "-j", "2").rc == 0
    assert run_cli("rewrite", "--tree", two).rc == 0
    a, b = state(one), state(two)
    assert {k: v[0] for k, v in a.items()} == {k: v[0] for k, v in b.items()}
    assert a["usr/bin/demo"][0] != hashlib.sha256(fixture("demo").read_bytes()).hexdigest()
    # the build-id is derived from the original's: the same in both, not the original's
    ids = {build_id_of(r / "usr/bin/demo") for r in (one, two)}
    assert len(ids) == 1 and None not in ids and build_id_of(fixture("demo")) not in ids
    again = run_cli("rewrite", "--tree", one, "-j", "2")
    assert again.rc == 0, again.err
    assert state(one) == a
    assert "0 rewritten, 1 unchanged, 0 refused (kept as they are), 2 rewritten before" \
        in again.out


def test_tree_form_is_fixed_not_the_build_hosts(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The build host's kernel is never asked: the tree gets the 6.18 form (and a named
    --kernel is kept)."""
    from usdtpatch.rewriter import kernel

    def asked() -> int:
        raise AssertionError("rewrite --tree asked the build host's kernel")

    monkeypatch.setattr(kernel, "uprobe_syscall_errno", asked)
    root = staged(tmp_path)
    assert run_cli("rewrite", "--tree", root).rc == 0
    assert forms(root / "usr/bin/demo") == {SiteForm.NOP5}
    other = staged(tmp_path, "other")
    res = run_cli("rewrite", "--tree", other, "--kernel", "nop10-series")
    assert res.rc == 0, res.err
    assert forms(other / "usr/bin/demo") == {SiteForm.COMBO10}


def test_tree_dry_run_writes_nothing(tmp_path: Path) -> None:
    root = staged(tmp_path)
    before = state(root)
    res = run_cli("rewrite", "--tree", root, "--dry-run")
    assert res.rc == 0, res.err
    assert "2 to rewrite" in res.out
    assert state(root) == before


@pytest.mark.parametrize("make", ["missing", "file"])
def test_tree_refuses_what_is_not_a_folder(tmp_path: Path, make: str) -> None:
    target = tmp_path / "x"
    if make == "file":
        target.write_text("")
    res = run_cli("rewrite", "--tree", target)
    assert res.rc == 2 and res.out == ""
    assert res.err.count("\n") == 1 and str(target) in res.err


def test_tree_refuses_files_and_output(tmp_path: Path) -> None:
    root = staged(tmp_path)
    for extra in ([str(fixture("demo"))], ["-o", str(tmp_path)],
                  ["--report", str(tmp_path / "r.json")]):
        res = run_cli("rewrite", "--tree", root, *extra)
        assert res.rc == 2 and "--tree" in res.err
    assert run_cli("rewrite", str(fixture("demo"))).rc == 2  # no -o, --in-place, --dry-run


def test_tree_with_an_unwritable_folder_rewrites_nothing(tmp_path: Path) -> None:
    """A folder root cannot write (immutable): one line, exit 2, and no file of the tree is
    rewritten, not even the ones in writable folders."""
    root = staged(tmp_path)
    lib = root / "usr/lib"
    if subprocess.run(["chattr", "+i", lib], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not possible here (needs root and ext4-like attributes)")
    try:
        before = state(root)
        res = run_cli("rewrite", "--tree", root)
        after = state(root)
    finally:
        subprocess.run(["chattr", "-i", lib], check=True)
    assert res.rc == 2 and res.out == ""
    assert "libprobes.so: cannot write: its folder" in res.err
    assert after == before


def test_tree_json_counts(tmp_path: Path) -> None:
    import json

    root = staged(tmp_path)
    res = run_cli("rewrite", "--tree", root, "--json")
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert doc["schema"] == "usdtpatch/rewrite"
    assert doc["tree"] == {"root": str(root), "regular": 5, "elf": 4, "with_probes": 3,
                           "rewritten": 2, "unchanged": 1, "refused": 0,
                           "rewritten_before": 0, "no_probes": 1, "unreadable": 0,
                           "debug": 0}
    assert sorted(e["path"] for e in doc["files"]) == sorted(
        str(root / p) for p in ("usr/bin/demo", "usr/bin/nop5", "usr/lib/libprobes.so"))


def test_tree_keeps_a_refused_file_and_goes_on(tmp_path: Path) -> None:
    """A file whose rewrite is refused (32-bit code) is kept as it is, its line says why, and
    the rest of the tree is rewritten: exit 0 (a package is built with it unchanged)."""
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy2(fixture("i386"), root / "i386")
    shutil.copy2(fixture("demo"), root / "demo")
    before = state(root)
    res = run_cli("rewrite", "--tree", root)
    assert res.rc == 0, res.err
    assert f"{root / 'i386'}: refused, kept as it is: rewriting needs x86-64" in res.out
    assert "1 rewritten, 0 unchanged, 1 refused (kept as they are)" in res.out
    after = state(root)
    assert after["i386"] == before["i386"] and after["demo"] != before["demo"]


def test_in_place_rewrite_where_nothing_changes_writes_nothing(tmp_path: Path) -> None:
    """`rewrite --in-place` of a file whose sites are 5-byte already (nothing converts) leaves
    the file itself: bytes, mtime and inode (before, the same bytes were written again)."""
    f = tmp_path / "nop5"
    shutil.copy2(fixture("nop5"), f)
    os.utime(f, ns=(1_000_000_000, 1_000_000_000))
    before = state(tmp_path)
    res = run_cli("rewrite", "--in-place", "--kernel", "6.18", f)
    assert res.rc == 0, res.err
    assert state(tmp_path) == before


def _chattr(flag: str, path: Path) -> None:
    if subprocess.run(["chattr", flag, path], capture_output=True, check=False).returncode:
        pytest.skip("chattr is not possible here (needs root and ext4-like attributes)")


def test_tree_with_an_immutable_file_rewrites_nothing(tmp_path: Path) -> None:
    root = staged(tmp_path)
    lib = root / "usr/lib/libprobes.so"
    _chattr("+i", lib)
    try:
        before = state(root)
        res = run_cli("rewrite", "--tree", root)
        after = state(root)
    finally:
        subprocess.run(["chattr", "-i", lib], check=True)
    assert res.rc == 2 and res.out == ""
    assert res.err == f"usdtpatch: rewrite --tree: {lib}: cannot write: the file is " \
                      f"immutable (chattr); nothing was rewritten\n"
    assert after == before


def test_tree_write_that_fails_after_the_check_is_exit_2(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A file the check let through whose write fails all the same (here: the check is
    skipped, the file immutable) is left whole, and the run exits 2, not 0 as a refusal."""
    from usdtpatch.integrate import tree

    monkeypatch.setattr(tree, "unwritable", lambda files: [])
    root = staged(tmp_path)
    lib = root / "usr/lib/libprobes.so"
    _chattr("+i", lib)
    try:
        before = state(root)["usr/lib/libprobes.so"]
        res = run_cli("rewrite", "--tree", root)
        after = state(root)["usr/lib/libprobes.so"]
    finally:
        subprocess.run(["chattr", "-i", lib], check=True)
    assert res.rc == 2, res.out + res.err
    assert after == before
    assert f"{lib}: refused, kept as it is:" in res.out


def test_tree_file_hard_linked_from_outside(tmp_path: Path) -> None:
    """A file of the tree with another name outside it is rewritten in the tree; the name
    outside keeps the original (the rename never writes through to it)."""
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy2(fixture("demo"), root / "demo")
    os.link(root / "demo", tmp_path / "outside")
    original = (tmp_path / "outside").read_bytes()
    res = run_cli("rewrite", "--tree", root)
    assert res.rc == 0, res.err
    assert "1 name(s) outside the tree keep the original" in res.out
    assert forms(root / "demo") == {SiteForm.NOP5}
    assert (tmp_path / "outside").read_bytes() == original
    assert os.stat(tmp_path / "outside").st_nlink == 1
