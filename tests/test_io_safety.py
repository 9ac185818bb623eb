"""Nothing damaged, nothing lost (issue 10, items 1, 2 and 5): outputs that are the input by
another spelling, outputs that are not regular files, inputs that are not regular files,
Ctrl-C, and the file named on every exit-2 line."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import default_sigint
from tests.helpers import ROOT, fixture, run_cli
from usdtpatch.cli.common import EXIT_INTERRUPTED, EXIT_UNUSABLE
from usdtpatch.errors import InputError, OutputError
from usdtpatch.io import check_output, map_input, read_input, write_atomic


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def prog(tmp_path: Path) -> Path:
    p = tmp_path / "prog"
    shutil.copy2(fixture("demo"), p)
    return p


@pytest.fixture
def rewritten(tmp_path: Path) -> Path:
    p = tmp_path / "prog.rw"
    assert run_cli("rewrite", fixture("demo"), "-o", p).rc == 0
    return p


def _one_line(err: str, name: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert name in lines[0], err
    return lines[0]


# ----------------------------------------------------------------- output names the input

@pytest.mark.parametrize("spelling", ["prog", "./prog", ".", "link", "hard"])
def test_rewrite_output_that_is_the_input_is_refused(prog: Path, spelling: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(prog.parent)
    (prog.parent / "link").symlink_to("prog")
    os.link(prog, prog.parent / "hard")
    before = _sha(prog)
    res = run_cli("rewrite", "prog", "-o", spelling)
    assert res.rc == EXIT_UNUSABLE
    assert "--in-place" in _one_line(res.err, "prog")
    assert _sha(prog) == before
    assert sorted(os.listdir(prog.parent)) == ["hard", "link", "prog"]  # no temp file


def test_in_place_still_replaces_the_input(prog: Path) -> None:
    before = _sha(prog)
    mode = stat.S_IMODE(prog.stat().st_mode)
    res = run_cli("rewrite", prog, "--in-place")
    assert res.rc == 0, res.err
    assert _sha(prog) != before and stat.S_IMODE(prog.stat().st_mode) == mode


@pytest.mark.parametrize("spelling", ["same", "./same", "link"])
def test_restore_output_that_is_the_input_is_refused(rewritten: Path, spelling: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(rewritten.parent)
    os.rename(rewritten, "same")
    Path("link").symlink_to("same")
    before = _sha(Path("same"))
    res = run_cli("restore", "same", "-o", spelling)
    assert res.rc == EXIT_UNUSABLE
    _one_line(res.err, "same")
    assert _sha(Path("same")) == before


def test_several_inputs_into_their_own_folder_are_refused(prog: Path) -> None:
    before = _sha(prog)
    other = prog.parent / "other"
    shutil.copy2(fixture("pie"), other)
    res = run_cli("rewrite", prog, other, "-o", prog.parent)
    assert res.rc == EXIT_UNUSABLE
    assert len(res.err.strip().splitlines()) == 2, res.err
    assert _sha(prog) == before


# ----------------------------------------------------------- outputs that are not files

def test_rewrite_never_replaces_dev_null() -> None:
    before = os.stat("/dev/null")
    for cmd in (["rewrite", str(fixture("demo")), "-o", "/dev/null"],):
        res = run_cli(*cmd)
        assert res.rc == EXIT_UNUSABLE
        assert "not a regular file" in _one_line(res.err, "/dev/null")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


def test_restore_never_replaces_dev_null(rewritten: Path) -> None:
    before = os.stat("/dev/null")
    res = run_cli("restore", rewritten, "-o", "/dev/null")
    assert res.rc == EXIT_UNUSABLE
    _one_line(res.err, "/dev/null")
    assert os.stat("/dev/null").st_ino == before.st_ino


def test_output_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    res = run_cli("rewrite", fixture("demo"), "-o", fifo)
    assert res.rc == EXIT_UNUSABLE
    _one_line(res.err, "fifo")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_link_to_a_device_is_refused(tmp_path: Path) -> None:
    (tmp_path / "null").symlink_to("/dev/null")
    res = run_cli("rewrite", fixture("demo"), "-o", tmp_path / "null")
    assert res.rc == EXIT_UNUSABLE
    assert os.path.islink(tmp_path / "null")


def test_restore_into_a_directory_is_refused(rewritten: Path, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    res = run_cli("restore", rewritten, "-o", tmp_path / "d")
    assert res.rc == EXIT_UNUSABLE
    _one_line(res.err, "d")
    assert os.listdir(tmp_path / "d") == []


def test_check_output_accepts_a_new_or_regular_file(tmp_path: Path) -> None:
    check_output(tmp_path / "new", [fixture("demo")])
    (tmp_path / "old").write_bytes(b"x")
    check_output(tmp_path / "old", [fixture("demo")])
    with pytest.raises(OutputError, match="is the input"):
        check_output(tmp_path / "old", [tmp_path / "old"])
    check_output(tmp_path / "old", [tmp_path / "old"], in_place=True)


def test_write_atomic_refuses_a_device() -> None:
    with pytest.raises(OutputError, match="not a regular file"):
        write_atomic("/dev/null", b"data")


# --------------------------------------------------------------- inputs that are not files

def _cli_subprocess(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "usdtpatch", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)


@pytest.mark.parametrize("command", ["list", "check", "rewrite --dry-run", "plan"])
def test_fifo_input_is_refused_without_blocking(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # a separate process: if it blocked on the FIFO, the timeout ends the test, not the run
    done = _cli_subprocess(*command.split(), str(fifo))
    assert done.returncode == EXIT_UNUSABLE
    assert "FIFO" in _one_line(done.stderr, str(fifo))


def test_device_and_socket_inputs_are_refused(tmp_path: Path) -> None:
    for dev in ("/dev/zero", "/dev/null"):
        res = run_cli("list", dev)
        assert res.rc == EXIT_UNUSABLE
        assert "character device" in _one_line(res.err, dev)
    path = tmp_path / "sock"
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as s:
        s.bind(str(path))
        res = run_cli("check", path)
    assert res.rc == EXIT_UNUSABLE
    assert "socket" in _one_line(res.err, "sock")


def test_read_input_reads_regular_files_only(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    assert read_input(p) == b"abc"
    with pytest.raises(InputError, match="FIFO"):
        os.mkfifo(tmp_path / "q")
        read_input(tmp_path / "q")


def test_map_input_maps_regular_files_only_read_only(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    mapped = map_input(p)
    assert not isinstance(mapped, bytes)
    assert mapped[:] == b"abc" and mapped.find(b"c") == 2 and len(mapped) == 3
    with pytest.raises(TypeError):
        mapped[0] = 1
    (tmp_path / "empty").write_bytes(b"")
    assert map_input(tmp_path / "empty") == b""  # mmap refuses empty files; nothing to map
    os.mkfifo(tmp_path / "q")
    for bad, what in ((tmp_path / "q", "FIFO"), (tmp_path, "directory"),
                      (tmp_path / "none", "no such file")):
        with pytest.raises(InputError, match=what):
            map_input(bad)


def test_map_input_reads_what_it_cannot_map(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that maps no file (ENODEV) still gives the file, read; out of
    descriptors or memory is one clear refusal, not a read attempt."""
    import errno
    import mmap

    p = tmp_path / "f"
    p.write_bytes(b"\x7fELF" + bytes(60))

    def refuse(code: int) -> Any:
        def fake(*args: object, **kwargs: object) -> mmap.mmap:
            raise OSError(code, os.strerror(code))
        return fake

    monkeypatch.setattr(mmap, "mmap", refuse(errno.ENODEV))
    assert map_input(p) == p.read_bytes()
    monkeypatch.setattr(mmap, "mmap", refuse(errno.EMFILE))
    with pytest.raises(InputError, match="Too many open files"):
        map_input(p)


def test_list_keeps_no_file_open() -> None:
    """`list` maps each file (a mapping holds a descriptor) and releases it before the next:
    600 files list under a limit of 64 descriptors."""
    code = textwrap.dedent(f"""
        import resource, sys
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        from usdtpatch.cli import main
        sys.exit(main(["list", "--json"] + [{str(fixture("pie"))!r}] * 600))
        """)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count('"path"') == 600


# --------------------------------------------------------------------------------- Ctrl-C

def test_ctrl_c_during_rewrite_exits_130_with_nothing_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from usdtpatch.rewriter import plan as plan_module

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_module, "plan_rewrite", interrupted)
    res = run_cli("rewrite", fixture("demo"), "-o", tmp_path / "out")
    assert res.rc == EXIT_INTERRUPTED
    assert _one_line(res.err, "interrupted")
    assert os.listdir(tmp_path) == []


def test_ctrl_c_while_writing_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    res = run_cli("rewrite", fixture("demo"), "-o", tmp_path / "out")
    assert res.rc == EXIT_INTERRUPTED
    assert os.listdir(tmp_path) == []


def test_ctrl_c_with_worker_processes(tmp_path: Path) -> None:
    """SIGINT to the whole process group (what a terminal sends) while -j workers run: one
    line, exit 130, no traceback from any process, no output and no temporary file."""
    for name in ("demo", "pie"):
        shutil.copy2(fixture(name), tmp_path / name)
    (tmp_path / "out").mkdir()
    driver = textwrap.dedent(f"""
        import os, signal, sys, time
        from usdtpatch.rewriter import plan as plan_module
        def slow(*args, **kwargs):
            os.killpg(os.getpgrp(), signal.SIGINT)
            time.sleep(30)
        plan_module.plan_rewrite = slow
        from usdtpatch.cli import main
        sys.exit(main(["rewrite", "-j", "2", "-o", {str(tmp_path / 'out')!r},
                       {str(tmp_path / 'demo')!r}, {str(tmp_path / 'pie')!r}]))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True,
                          timeout=120, env=env, start_new_session=True, check=False,
                          preexec_fn=default_sigint)
    assert done.returncode == EXIT_INTERRUPTED, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == ["usdtpatch: interrupted; nothing was written"], \
        done.stderr
    assert os.listdir(tmp_path / "out") == []


# ------------------------------------------------------------- exit-2 lines name the file

@pytest.mark.parametrize("argv", [
    ["plan", "{bad}"], ["plan", "{aarch64}"], ["verify", "{bad}"], ["verify", "{aarch64}"],
    ["restore", "{bad}", "-o", "{tmp}/r"], ["restore", "{demo}", "-o", "{tmp}/r"],
    ["show", "{bad}", "--probe", "a:b"], ["show", "{demo}", "--probe", "no:such"],
    ["list", "{bad}"], ["check", "{bad}"], ["rewrite", "--dry-run", "{bad}"],
    ["rewrite", "--dry-run", "{aarch64}"],
])
def test_every_exit_2_line_names_the_file(argv: list[str], tmp_path: Path) -> None:
    bad = tmp_path / "notelf"
    bad.write_bytes(b"not an ELF file at all")
    names = {"bad": str(bad), "aarch64": str(fixture("aarch64")), "demo": str(fixture("demo")),
             "tmp": str(tmp_path)}
    args = [a.format(**names) for a in argv]
    res = run_cli(*args)
    assert res.rc == EXIT_UNUSABLE, (res.rc, res.err)
    _one_line(res.err, args[1] if args[1] != "--dry-run" else args[2])


def test_report_and_header_outputs_never_replace_their_input(prog: Path, tmp_path: Path
                                                             ) -> None:
    before = _sha(prog)
    for flag in ("--html", "--sarif"):
        res = run_cli("check", prog, flag, "--report", prog)
        assert res.rc == EXIT_UNUSABLE
        assert "--in-place" not in _one_line(res.err, "prog")
    assert _sha(prog) == before
    d = tmp_path / "p.d"
    d.write_text("provider app { probe start(); };\n")
    res = run_cli("dtrace", "-h", "-s", d, "-o", d)
    assert res.rc == EXIT_UNUSABLE
    assert d.read_text() == "provider app { probe start(); };\n"
    assert run_cli("dtrace", "-h", "-s", d, "-o", tmp_path / "p.h").rc == 0


def test_a_link_in_the_output_folder_is_replaced_not_followed(tmp_path: Path) -> None:
    """`-o DIR` where DIR/NAME is a link elsewhere: the link becomes the output; the file it
    pointed at (a place the user did not name) is untouched."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"someone else's file")
    out = tmp_path / "out"
    out.mkdir()
    (out / "demo").symlink_to(elsewhere)
    res = run_cli("rewrite", fixture("demo"), "-o", out)
    assert res.rc == 0, res.err
    assert elsewhere.read_bytes() == b"someone else's file"
    assert not (out / "demo").is_symlink() and (out / "demo").stat().st_size > 1000


def test_an_output_in_a_missing_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    res = run_cli("rewrite", fixture("demo"), "-o", tmp_path / "no" / "out")
    assert res.rc == EXIT_UNUSABLE
    assert "not a folder" in _one_line(res.err, "out")


def test_exit_2_line_escapes_control_characters_from_the_file(tmp_path: Path) -> None:
    """A note's name holding a vertical tab and an escape (any byte can be in a file) is
    shown escaped: the refusal stays one line and sends nothing raw to the terminal."""
    data = bytearray(fixture("adjacent").read_bytes())
    at = data.find(b"adjacent\0first\0")
    assert at > 0
    data[at + 9 + 3] = 0x0B  # fir\vt
    data[at + 9 + 4] = 0x1B  # ...\x1b
    bad = tmp_path / "bad"
    bad.write_bytes(bytes(data))
    res = run_cli("show", bad, "--probe", "adjacent:first")
    assert res.rc == EXIT_UNUSABLE
    line = _one_line(res.err, "bad")
    assert "\\x0b" in line and "\\x1b" in line and "\x1b" not in res.err
