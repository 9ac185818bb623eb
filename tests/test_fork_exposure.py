"""What `check` says of a file that may fork is what `rewrite` does (issue 31): both ask
usdtpatch.analysis.forkexposure. A program that names no fork of its own but loads a library
other than the C library's, calls dlopen, or looks functions up with dlsym is guarded by
`rewrite --fork-guard auto`; check says `process-can-fork` of it, naming the route. Before,
check said nothing of those programs while rewrite added the guard. A program that can fork
by none of them (the C library only, no lookup) gets neither."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, fixture, run_cli
from usdtpatch import api

DATA = ROOT / "tests" / "data"


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {"libraries": fixture("uses-shared"), "none": fixture("pie")}
    if shutil.which("gcc") is not None:
        d = tmp_path_factory.mktemp("exposure")
        for name, src in (("lookup", "lookupfork.c"), ("dlopen", "dlopenfork.c")):
            subprocess.run(["gcc", "-O2", "-I", str(ROOT / "fixtures" / "src"),
                            str(DATA / src), "-o", str(d / name)], check=True)
            out[name] = d / name
    return out


def _guarded(path: Path, tmp: Path) -> bool:
    res = run_cli("rewrite", path, "-o", tmp / "out", "--json")
    assert res.rc == 0, res.err
    return any(f["code"] == "fork-guarded"
               for f in json.loads(res.out)["files"][0]["findings"])


@pytest.mark.parametrize(("name", "said"), [
    ("libraries", "it loads libprobes.so"), ("lookup", "it calls dlsym"),
    ("dlopen", "it calls dlopen"), ("none", None)])
def test_check_says_what_rewrite_guards(programs: dict[str, Path], tmp_path: Path, name: str,
                                        said: str | None) -> None:
    if name not in programs:
        pytest.skip("needs gcc")
    path = programs[name]
    found = [f.message for f in api.check(path).findings if f.code == "process-can-fork"]
    if said is None:
        assert found == []
        assert not _guarded(path, tmp_path)
    else:
        assert len(found) == 1 and found[0].startswith(said), found
        assert _guarded(path, tmp_path)
