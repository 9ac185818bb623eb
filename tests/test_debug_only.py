"""Separate debug files (issue 47, item 4): a file made by `objcopy --only-keep-debug` (as
Debian's python3.11-dbg ships them, 8 probes each) keeps its notes while its code is NOBITS.
check reported 8 errors and exited 1, rewrite exited 2 with an .eh_frame_hdr message and
--tree listed it as refused. Now: `list` lists its probes; check and rewrite say in one line
that there is nothing to judge or rewrite (exit 0) and which binary it belongs to (its
build-id); the tree counts it as a debug file and names the file of the tree it belongs to.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli
from usdtpatch import api

pytestmark = pytest.mark.needs_cc


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("gcc") is None or shutil.which("objcopy") is None:
        pytest.skip("needs gcc and objcopy")
    folder = tmp_path_factory.mktemp("debug-only")
    exe, debug = folder / "app", folder / "app.debug"
    subprocess.run(["gcc", "-g", "-O2", "-o", str(exe), str(ROOT / "tests/data/sdt/probes.c"),
                    str(ROOT / "tests/data/sdt/sema.c")], check=True, timeout=120)
    subprocess.run(["objcopy", "--only-keep-debug", str(exe), str(debug)], check=True,
                   timeout=60)
    return exe, debug


def test_the_library_recognises_a_debug_file(built: tuple[Path, Path]) -> None:
    exe, debug = built
    probes = api.load(debug)
    assert len(probes.probes) == len(api.load(exe).probes) > 0
    found = api.debug_file(probes)
    assert found is not None and found.build_id == api.load(exe).image.build_id
    assert api.debug_file(api.load(exe)) is None
    with pytest.raises(api.DebugOnlyFile, match="separate debug file"):
        api.check(debug)
    with pytest.raises(api.DebugOnlyFile):
        api.rewrite(debug, None)


def test_list_check_and_rewrite_of_a_debug_file(built: tuple[Path, Path],
                                                tmp_path: Path) -> None:
    exe, debug = built
    listed = json.loads(run_cli("list", "--json", debug).out)
    assert len(listed["files"][0]["probes"]) == len(api.load(exe).probes)
    for argv in (("check", debug), ("check", "--json", debug), ("rewrite", "--dry-run", debug)):
        res = run_cli(*argv)
        assert res.rc == 0, res.err
        said = (res.out + res.err).strip().splitlines()
        said = [x for x in said if "separate debug file" in x]
        assert len(said) == 1 and str(api.load(exe).image.build_id) in said[0], res.out + res.err
        assert "Traceback" not in res.err and "eh_frame_hdr" not in res.out + res.err
    copy = tmp_path / "app.debug"
    shutil.copy2(debug, copy)
    before = copy.read_bytes()
    res = run_cli("rewrite", "--in-place", copy)
    assert res.rc == 0 and "nothing to check or rewrite" in res.out
    assert copy.read_bytes() == before


def test_the_tree_counts_a_debug_file_and_names_its_binary(built: tuple[Path, Path],
                                                           tmp_path: Path) -> None:
    exe, debug = built
    root = tmp_path / "root"
    build_id = str(api.load(exe).image.build_id)
    where = root / "usr/lib/debug/.build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    where.parent.mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    shutil.copy2(exe, root / "usr/bin/app")
    shutil.copy2(debug, where)
    res = run_cli("rewrite", "--tree", root, "--dry-run")
    assert res.rc == 0, res.err
    assert "refused" not in res.out.replace("0 refused", "")
    line = next(x for x in res.out.splitlines() if str(where) in x)
    assert "separate debug file, nothing to rewrite" in line
    assert f"the debug file of {root / 'usr/bin/app'}" in line
    assert "1 separate debug file (nothing to rewrite)" in res.out
    doc = json.loads(run_cli("rewrite", "--tree", root, "--dry-run", "--json").out)
    assert doc["tree"]["debug"] == 1 and doc["tree"]["refused"] == 0
