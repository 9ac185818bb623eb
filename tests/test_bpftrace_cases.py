"""The runner of bpftrace's test format (tests/bpftrace_cases.py), without a kernel: the
parser must reject malformed cases, and the runner is driven by a fake `bpftrace` (a shell
script that prints what a case makes it print) to show that it passes, fails and skips as
the format says."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.bpftrace_cases import NOTIFY, Case, FormatError, Runner, parse_cases

GOOD = """# a comment
NAME "one"
RUN {{BPFTRACE}} -e 'x' -p {{BEFORE_PID}}
EXPECT ^here$
TIMEOUT 5
BEFORE ./prog
REQUIRES ./prog should_not_skip
REQUIRES true

NAME two
PROG BEGIN { exit(); }
EXPECT_REGEX a.c
TIMEOUT 1
REQUIRES_FEATURE uprobe_refcount !btf
ENV A=1 B=2
WILL_FAIL
"""


def test_parse_reads_every_field() -> None:
    one, two = parse_cases(GOOD, "usdt")
    assert (one.name, one.run, one.expect, one.timeout, one.before) == (
        '"one"', "{{BPFTRACE}} -e 'x' -p {{BEFORE_PID}}", "^here$", 5.0, "./prog")
    assert one.requires == ("./prog should_not_skip", "true")
    assert one.line == 2 and one.id == 'usdt."one"'
    assert (two.prog, two.expect, two.will_fail) == ("BEGIN { exit(); }", "a.c", True)
    assert two.features == {"uprobe_refcount"} and two.missing_features == {"btf"}
    assert two.env == (("A", "1"), ("B", "2"))


@pytest.mark.parametrize(("text", "message"), [
    ("NAME a\nRUN x\nEXPECT y\nTIMEOUT 1\nBOGUS z\n", "unknown field 'BOGUS'"),
    ("RUN x\nEXPECT y\nTIMEOUT 1\n", "without NAME"),
    ("NAME a\nRUN x\nPROG y\nEXPECT y\nTIMEOUT 1\n", "exactly one of RUN and PROG"),
    ("NAME a\nEXPECT y\nTIMEOUT 1\n", "exactly one of RUN and PROG"),
    ("NAME a\nRUN x\nTIMEOUT 1\n", "no EXPECT"),
    ("NAME a\nRUN x\nEXPECT y\n", "no TIMEOUT"),
    ("NAME a\nRUN x\nEXPECT y\nTIMEOUT soon\n", "TIMEOUT 'soon' is not a number"),
    ("NAME a\nRUN x\nEXPECT y\nTIMEOUT 1\nREQUIRES_FEATURE warp\n", "unknown REQUIRES_FEATURE"),
], ids=["field", "name", "both", "neither", "expect", "timeout", "number", "feature"])
def test_parse_rejects(text: str, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        parse_cases(text, "t")


FAKE = f"""#!/bin/sh
# a stand-in for bpftrace: --info lists one feature; -e PROGRAM does what PROGRAM says
if [ "$1" = --info ]; then echo "Loop support: yes"; exit 0; fi
case "$2" in
  attach-print) echo "Attaching 1 probe..."; echo {NOTIFY}; echo "here $4"; exit 0;;
  attach-hang) echo {NOTIFY}; echo "waiting"; exec sleep 60;;
  never-attach) exec sleep 60;;
  fail) echo {NOTIFY}; echo "here"; exit 3;;
esac
exit 2
"""


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    fake = tmp_path / "fake-bpftrace"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    (work / "prog").write_text("#!/bin/sh\nwhile :; do sleep 1; done\n")
    (work / "prog").chmod(0o755)
    return Runner(work, bpftrace=str(fake), timeout_scale=1.0)


def _case(**kw: object) -> Case:
    base: dict[str, object] = {"suite": "t", "name": "c", "line": 1, "timeout": 1.0}
    base.update(kw)
    return Case(**base)  # type: ignore[arg-type]


def test_runner_passes_a_matching_case(runner: Runner) -> None:
    out = runner.run(_case(run="{{BPFTRACE}} -e attach-print", expect="^here $"))
    assert out.status == "pass", out
    assert "Attaching 1 probe" in out.output


def test_runner_fails_without_a_match_and_on_a_bad_exit(runner: Runner) -> None:
    out = runner.run(_case(run="{{BPFTRACE}} -e attach-print", expect="^elsewhere$"))
    assert (out.status, out.reason) == ("fail", "ended without a match for '^elsewhere$'")
    bad = runner.run(_case(run="{{BPFTRACE}} -e fail", expect="here"))
    assert (bad.status, bad.reason) == ("fail", "bpftrace exited 3")
    assert runner.run(_case(run="{{BPFTRACE}} -e fail", expect="here",
                            will_fail=True)).status == "pass"


def test_runner_timeout_passes_only_with_a_match(runner: Runner) -> None:
    start = time.monotonic()
    out = runner.run(_case(run="{{BPFTRACE}} -e attach-hang", expect="nothing like it"))
    assert out.status == "fail" and "timed out" in out.reason
    assert time.monotonic() - start < 20
    ok = runner.run(_case(run="{{BPFTRACE}} -e attach-hang", expect="^waiting$"))
    assert ok.status == "pass", ok


def test_runner_skips_for_requires_and_features(runner: Runner) -> None:
    assert runner.run(_case(prog="x", expect="y", requires=("exit 1",))).status == "skip"
    skip = runner.run(_case(prog="x", expect="y", features=frozenset({"btf"})))
    assert (skip.status, skip.reason) == (
        "skip", "REQUIRES_FEATURE btf: bpftrace --info does not have it")
    have = runner.run(_case(prog="x", expect="y", missing_features=frozenset({"loop"})))
    assert (have.status, have.reason) == ("skip", "REQUIRES_FEATURE !loop: bpftrace --info has it")
    assert runner.run(_case(prog="x", expect="y", arch=("sparc",))).status == "skip"
    assert runner.run(_case(prog="x", expect="y", min_kernel="99.0")).status == "skip"


def test_runner_before_pid_and_cleanup(runner: Runner) -> None:
    """BEFORE starts ./prog; {{BEFORE_PID}} is its pid; pidof in the commands sees only the
    processes of the test directory; everything a case started is gone afterwards."""
    out = runner.run(_case(run="{{BPFTRACE}} -e attach-print -p {{BEFORE_PID}}",
                           expect=r"^here \d+$", before="./prog"))
    assert out.status == "pass", out
    pid = int(out.output.split("here ")[1].split()[0])
    assert runner.pids_named("prog") == []
    assert not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text(
        ).split()[2] == "Z"
    scoped = runner.run(_case(run="test -z \"$(pidof sleep)\" && echo " + NOTIFY
                            + " && echo none", expect="^none$"))
    assert scoped.status == "pass", scoped


def test_fetch_source_refuses_a_package_that_is_not_installed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tools/fetch_source.py (make bpftrace-src): one line and exit 1, the reason kept beside
    the destination for the tests' skip, nothing else written."""
    from tools.fetch_source import main

    dest = tmp_path / "src"
    assert main(["usdtpatch-no-such-package", str(dest), "--cache", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usdtpatch-no-such-package" in err
    assert "not installed" in (tmp_path / "src.error").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.error"]


def test_fetch_source_apt_stays_private(tmp_path: Path) -> None:
    """Every directory apt is told to use is under the private configuration."""
    from tools.fetch_source import apt_options

    opts = apt_options(tmp_path)
    dirs = [o.split("=", 1)[1] for o in opts if o.startswith("Dir::") and "status" not in o]
    assert len(dirs) == 5 and all(d.startswith(str(tmp_path)) for d in dirs)
