"""elf/demangle.py: c++filt through posix_spawn with the names as arguments gives what c++filt
gives for the same names on its standard input."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers import REAL_BINARIES, fixture
from usdtpatch.elf import demangle as dm
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.symbols import load_symbols


def test_same_as_cxxfilt_on_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    tool = shutil.which("c++filt")
    if tool is None:
        pytest.skip("c++filt not installed")
    path = REAL_BINARIES["libstdc++"]
    if not path.exists():
        path = fixture("cxx-throw")
    table = load_symbols(parse_elf(path.read_bytes()))
    names = sorted({table.name_at(i) for i in range(len(table))}
                   | {"_Z1fv.cold", "_ZN3FooC2Ev.part.0", "_Z", "_Zjunk", "main", "-n"})
    mangled = [n for n in names if n.startswith("_Z")]
    assert len(mangled) > 10
    monkeypatch.setattr(dm, "MAX_ARGS_BYTES", 4096)  # several c++filt processes
    got = dm.demangle(names)
    lines = subprocess.run([tool], input="\n".join(mangled) + "\n", capture_output=True,
                           text=True, check=True).stdout.split("\n")
    assert got == {m: d for m, d in zip(mangled, lines, strict=False) if d}
    assert "main" not in got and got["_Z1fv.cold"] == "f() [clone .cold]"


def test_without_cxxfilt_names_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert dm.demangle(["_Z1fv"]) == {}


def test_without_cxxfilt_the_commands_say_names_stay_mangled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Demangling runs binutils' c++filt, not a Python dependency: without it, names stay
    mangled and `list` and `check` say so in one line (issue 34, item 10)."""
    from tests.helpers import fixture, run_cli

    monkeypatch.setenv("PATH", "/nonexistent")
    for argv in (["list"], ["check", "--fail-on", "never"]):
        res = run_cli(*argv, fixture("cxx-throw"))
        assert res.rc == 0
        assert res.err.count("c++filt (binutils) is not on PATH") == 1, res.err
    assert run_cli("list", fixture("demo")).err == ""  # no C++ name: nothing to say


def test_dir_shows_the_public_api() -> None:
    import usdtpatch

    names = dir(usdtpatch)
    assert {"load", "check", "rewrite", "restore", "plan", "verify"} <= set(names)
    assert not {"TYPE_CHECKING", "annotations", "import_module"} & set(names)
