"""A terminal gets the pipe's rule (issue 34, items 1 and 2): `list`, `check` and `rewrite`
run under a pseudo-terminal print what they print to a pipe at the same $COLUMNS (no value
cut, no column dropped, rows wrapped only between words), libjvm.so's rewrite table takes
about two lines a site at 120 columns, and NO_COLOR or TERM=dumb turn every escape of colour
and style off, the progress bar's too."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, fixture

LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")
SGR = re.compile(r"\x1b\[[0-9;]*m")  # colour and style
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # any control sequence


def _env(columns: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS", "LINES")}
    env.update({"PYTHONPATH": str(ROOT), "COLUMNS": str(columns), "TERM": "xterm-256color",
                **extra})
    return env


def on_terminal(argv: list[str], columns: int, **extra: str) -> tuple[str, int]:
    return terminal_run(argv, columns, extra)


def terminal_run(argv: list[str], columns: int, extra: dict[str, str],
                 stderr_away: bool = False) -> tuple[str, int]:
    """`usdtpatch argv` with stdout and stderr on a pseudo-terminal `columns` wide: what it
    printed (raw: escapes kept, "\\r\\n" line ends) and its exit status. `stderr_away`:
    standard error elsewhere (no progress bar, whose frames a loaded machine leaves between
    the lines of the table when a run lasts over a second)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "usdtpatch", *argv], stdin=slave,
                            stdout=slave, stderr=subprocess.DEVNULL if stderr_away else slave,
                            env=_env(columns, **extra), cwd=ROOT)
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: the child closed its side
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        rc = proc.wait(timeout=300)
    return b"".join(chunks).decode(), rc


def in_pipe(argv: list[str], columns: int) -> str:
    res = subprocess.run([sys.executable, "-m", "usdtpatch", *argv], capture_output=True,
                         text=True, env=_env(columns), cwd=ROOT, timeout=300, check=False)
    return res.stdout


def _text(raw: str) -> str:
    return ESCAPE.sub("", raw).replace("\r\n", "\n")


CASES = [("list", "demo"), ("list", "args-O2"), ("check", "args-O2"), ("check", "demo"),
         ("check", "cxx-throw"), ("rewrite", "args-O2"), ("rewrite", "cxx-throw")]


@pytest.mark.parametrize("columns", [80, 100, 120])
@pytest.mark.parametrize(("command", "name"), CASES, ids=[f"{c}-{n}" for c, n in CASES])
def test_a_terminal_gets_the_pipes_layout(command: str, name: str, columns: int) -> None:
    argv = [command, str(fixture(name))]
    argv += {"check": ["--fail-on", "never"], "rewrite": ["--dry-run"]}.get(command, [])
    raw, rc = terminal_run(argv, columns, {}, stderr_away=True)
    assert rc == 0, raw
    piped = in_pipe(argv, columns)
    assert _text(raw) == piped
    # and the pipe's rule holds: every name whole, its row starting a line with it
    doc = __import__("json").loads(in_pipe([*argv, "--json"], columns))
    tokens = piped.split()
    for f in doc["files"]:
        for row in f.get("probes") or f.get("sites") or []:
            assert any(line.split()[:1] == [f"{row['provider']}:{row['name']}"]
                       for line in piped.splitlines())
            assert f"{row['address']:#x}" in tokens
            for word in (row.get("function") or "").split():
                assert word in tokens


@pytest.mark.slow
@pytest.mark.skipif(not LIBJVM.exists(), reason=f"{LIBJVM} not installed")
def test_libjvm_rewrite_table_on_a_terminal(tmp_path: Path) -> None:
    """At 120 columns the detail of each of libjvm.so's 531 sites went over five lines a row
    (rich folded it into the space left); now its row and one line of detail below it, the
    progress bar without colour under NO_COLOR."""
    lib = tmp_path / "libjvm.so"
    shutil.copyfile(LIBJVM, lib)
    raw, rc = on_terminal(["rewrite", "--dry-run", str(lib)], 120, NO_COLOR="1")
    assert rc == 0
    assert not SGR.search(raw)
    lines = _text(raw).splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("probe "))
    end = next(i for i, x in enumerate(lines) if x.startswith("  531 site(s)"))
    table = lines[head + 1:end]
    rows = [line for line in table if not line.startswith(" ")]
    assert len(rows) == 531
    assert len(table) < 2.2 * len(rows)  # 3,540 lines before
    assert all(len(line) <= 120 for line in table)


def test_no_color_and_dumb_terminals_get_no_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress bar of rewrite on a terminal, with NO_COLOR and with TERM=dumb."""
    from usdtpatch.report.render import make_console, site_progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    def bar() -> str:
        buf = Tty()
        with site_progress(make_console(buf), after=0) as progress_for:
            shown = progress_for("prog")
            shown.sites(5, 10)
            shown.phase("verify")
        return buf.getvalue()

    for k in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert SGR.search(bar())  # a colour terminal: colour (the test can fail)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not SGR.search(bar())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not ESCAPE.search(bar())


@pytest.mark.parametrize("extra", [{"NO_COLOR": "1"}, {"TERM": "dumb"}])
def test_commands_on_a_terminal_honour_no_color(extra: dict[str, str]) -> None:
    for argv in (["list", str(fixture("demo"))], ["show", str(fixture("demo")), "-p", "parse"],
                 ["check", str(fixture("demo")), "--fail-on", "never"]):
        raw, _ = on_terminal(argv, 100, **extra)
        assert not SGR.search(raw), argv


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is missing")
def test_the_verification_is_counted(tmp_path: Path) -> None:
    """Item 3: the verification (workers proving and emulating the detours) showed an empty
    bar and a clock; now `progress` counts the detours verified after phase "verify", and
    build, check and write fill the bar step by step."""
    from usdtpatch import api
    from usdtpatch.report.render import LATE_PHASES, make_console, site_progress

    src = tmp_path / "many.c"
    subprocess.run([sys.executable, str(ROOT / "fixtures" / "gen_synthetic.py"), "--probes",
                    "40", "--style", "lite", "-o", str(src)], check=True)
    prog = tmp_path / "many"
    subprocess.run(["gcc", "-O2", "-o", str(prog), str(src)], check=True)
    events: list[tuple[str, int, int]] = []
    state = ["plan"]

    def phase(name: str) -> None:
        state[0] = name
        events.append((name, 0, 0))

    api.rewrite(prog, tmp_path / "out", jobs=2, phase=phase,
                progress=lambda d, t: events.append((f"{state[0]}-count", d, t)))
    counted = [(d, t) for e, d, t in events if e == "verify-count"]
    assert counted and counted[-1][0] == counted[-1][1] >= 24
    assert [d for d, _ in counted] == sorted(d for d, _ in counted)

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    buf = Tty()
    with site_progress(make_console(buf, width=120), after=0) as progress_for:
        shown = progress_for("many")
        shown.phase("verify")
        shown.sites(16, 40)
        time.sleep(0.35)  # the bar is drawn by rich's refresh thread, 10 times a second
        for name in LATE_PHASES:
            shown.phase(name)
            time.sleep(0.35)
    text = buf.getvalue()
    assert "16/40 detours verified" in text
    assert all(f"step {n}/3" in text for n in (1, 2, 3))


def test_the_bar_is_there_before_the_first_site() -> None:
    """Item 7 of issue 47: `rewrite libjvm.so` showed a blank terminal for ~8 s (the file read
    and checked before the first site's decision, the bar's first callback), then a bar whose
    clock already read 0:00:11. The bar comes `after` seconds from the start whatever the
    work calls back, saying what is going on."""
    from usdtpatch.report.render import make_console, site_progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    buf = Tty()
    with site_progress(make_console(buf, width=100), after=0.1) as progress_for:
        progress_for("libjvm.so")
        time.sleep(0.6)  # no callback: the file is still read and checked
        drawn = buf.getvalue()
    assert "libjvm.so: read and check" in drawn
    assert "0:00:00" in drawn  # the clock counts from the file's start


PYTHON311 = Path("/usr/bin/python3.11")
# every command whose text a terminal shows (kcheck and bench need the live kernel: their text
# goes through the same page as plan's and verify's, report.text.print_text)
EVERY_COMMAND = [
    ["list", "{cxx}"], ["check", "--fail-on", "never", "{cxx}"],
    ["show", "{leaf}", "--probe", "*"], ["show", "{cxx}", "--probe", "*"],
    ["rewrite", "--dry-run", "{args}"], ["rewrite", "--dry-run", "{cxx}"],
    ["plan", "{demo}"], ["verify", "{demo}"], ["explain"], ["explain", "red-zone-live"],
    ["explain", "assumptions"], ["post-link", "--check-only", "--fail-on", "never", "{leaf}"],
    ["list", "{python}"], ["check", "--fail-on", "never", "{python}"],
    ["show", "{python}", "--probe", "line"],
]
_TIMING = re.compile(r"^[\d.]+$|^\d+:\d\d:\d\d$")  # times differ from run to run


def _argv(template: list[str]) -> list[str] | None:
    files = {"cxx": fixture("cxx-throw"), "leaf": fixture("redzone-leaf"),
             "args": fixture("args-O2"), "demo": fixture("demo"), "python": PYTHON311}
    if any("{python}" in a for a in template) and not PYTHON311.exists():
        return None
    return [a.format(**{k: str(v) for k, v in files.items()}) for a in template]


@pytest.mark.parametrize("template", EVERY_COMMAND, ids=[" ".join(c) for c in EVERY_COMMAND])
def test_every_command_keeps_the_pages_rule_on_a_terminal(template: list[str]) -> None:
    """Issue 47, item 5: on a real terminal of 60, 80, 120 and 200 columns no line of any
    command is wider than the page (but a lone word wider than it, which stays whole), none
    ends in a space, no value is cut (every word is one of the unlimited page's: `outc`/`ome`
    and `(nop…` were) and none is dropped (every word of the unlimited page is there, the
    tables' headings aside, which a record layout writes as `heading:`)."""
    argv = _argv(template)
    if argv is None:
        pytest.skip(f"{PYTHON311} is not installed")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    wide = subprocess.run([sys.executable, "-m", "usdtpatch", *argv], capture_output=True,
                          text=True, env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                          timeout=300, check=False).stdout
    lines = wide.splitlines()
    headings = {w for line in lines for w in line.split()
                if re.match(r"\s*(probe|address)\s", line)}
    words = {w for w in wide.split() if not _TIMING.match(w)}
    for columns in (60, 80, 120, 200):
        raw, _rc = terminal_run(argv, columns, {}, stderr_away=True)
        text = _text(raw)
        said: set[str] = set()
        for line in text.splitlines():
            assert line == line.rstrip(), (columns, line)
            assert "\u2026" not in line, (columns, line)
            parts = line.split()
            assert len(line) <= columns or len(parts) == 1 or \
                (len(parts) == 2 and parts[0].endswith(":")), (columns, line)
            for w in parts:
                if _TIMING.match(w):
                    continue
                said.add(w)
                assert w in words or (w.endswith(":") and w[:-1] in headings | words), \
                    (columns, w, line)
        missing = words - said - headings - {"-"}
        assert not missing, (columns, sorted(missing)[:10])
