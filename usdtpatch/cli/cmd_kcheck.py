"""`usdtpatch kcheck FILE [--json] -- COMMAND...` or `usdtpatch kcheck FILE --pid PID
[--duration S]`: attach a uprobe to every USDT site of FILE in the process, let it run, and
report what the running kernel did with each site (usdtpatch.api.kcheck). Exit 0 when every
site is as the plan predicts, detach restored it and no process died at a site; 1 otherwise;
2 when kcheck cannot run here (not root, no uprobe PMU, no uprobe syscall) or on bad input;
128 + the signal after Ctrl-C, SIGTERM or SIGHUP (the same cleanup for all three).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
from collections.abc import Callable
from typing import IO, Any

from usdtpatch import api
from usdtpatch.api import UsdtpatchError, check_output, umask_mode, write_atomic
from usdtpatch.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_UNUSABLE,
    error_line,
    printable,
    raise_terminated,
)
from usdtpatch.report.kcheck import kcheck_json, kcheck_text
from usdtpatch.report.listing import PROBE_PATTERN_HELP, probe_pattern
from usdtpatch.report.text import print_text


def register(sub: Any) -> None:
    p = sub.add_parser(
        "kcheck", help="attach uprobes to FILE's sites in a process and report what the "
                       "running kernel did (root; exit 1 if a site is not as planned)",
        description="Attach a counting uprobe to every USDT site of FILE in COMMAND (started "
                    "here: `usdtpatch kcheck FILE -- COMMAND ARGS...`) or in a running process "
                    "(--pid), follow its threads and forks, and report per site: hits, "
                    "optimized or not, bytes and trampoline against `usdtpatch plan`, and the "
                    "bytes after detach. Children that die with SIGSEGV at a site are reported.")
    p.add_argument("file", metavar="FILE", help="the executable or library holding the probes")
    _options(p)
    # dest "argv": "command" is the main parser's name for the subcommand
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="the program to run (after --)")
    p.set_defaults(func=run)


def _seconds(minimum: float, strict: bool) -> Callable[[str], float]:
    """An argparse type: a number of seconds > minimum (strict) or >= minimum."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not (value > minimum if strict else value >= minimum):
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected seconds {'>' if strict else '>='} {minimum:g}")
        return value
    return parse


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pid", type=int, metavar="PID", help="a running process that maps FILE")
    p.add_argument("--probe", action="append", default=[], metavar="PATTERN",
                   help=f"only these probes: {PROBE_PATTERN_HELP} (repeatable; default: every "
                        f"probe of FILE)")
    p.add_argument("--duration", type=_seconds(0, strict=True), default=5.0, metavar="SECONDS",
                   help="with --pid: how long to watch (default 5)")
    p.add_argument("--settle", type=_seconds(0, strict=False), default=2.0, metavar="SECONDS",
                   help="after COMMAND exits, how long its remaining children are watched "
                        "(default 2)")
    p.add_argument("--json", action="store_true", help="print a versioned JSON document")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the report (text or --json) to FILE instead of standard output "
                        "(as perf stat -o); without it, under --json the command's standard "
                        "output goes to standard error, out of the document")


def _split(args: argparse.Namespace, err: IO[str]) -> list[str] | None:
    """The command after `--`; options between FILE and `--` are parsed here (argparse's
    REMAINDER takes everything after FILE). None after a usage error."""
    rest = list(args.argv)
    if not rest or not rest[0].startswith("-"):
        return rest  # argparse dropped the `--` right after FILE (or there was none)
    i = rest.index("--") if "--" in rest else len(rest)
    head, command = rest[:i], rest[i + 1:]
    if head:
        again = argparse.ArgumentParser(prog="usdtpatch kcheck", add_help=False)
        _options(again)
        try:
            again.parse_args(head, namespace=args)
        except SystemExit:
            return None
    return command


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    command = _split(args, err)
    if command is None:
        return EXIT_UNUSABLE
    if (args.pid is None) == (not command):
        print("usdtpatch: kcheck: give a command after -- or --pid PID (one of them)",
              file=err)
        return EXIT_UNUSABLE
    if args.output is not None:
        try:  # refused before anything is started or attached
            check_output(args.output, [args.file], can_in_place=False)
        except UsdtpatchError as exc:
            print(printable(f"usdtpatch: kcheck: {exc}"), file=err)
            return EXIT_UNUSABLE
    # the document alone on standard output: the command writes to standard error instead
    command_stdout = 2 if args.json and args.output is None and command else None
    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):  # not the main thread: left as they are
                previous[sig] = signal.signal(sig, raise_terminated)
        rep = api.kcheck(args.file, command=command or None, pid=args.pid,
                         probes=[probe_pattern(p) for p in args.probe],
                         duration=args.duration, settle=args.settle,
                         command_stdout=command_stdout)
    except UsdtpatchError as exc:
        error_line(args.file, exc, err)
        return EXIT_UNUSABLE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    text = json.dumps(kcheck_json(rep), indent=2) + "\n" if args.json else kcheck_text(rep)
    if args.output is None and args.json:
        out.write(text)  # a document: never laid out on the page
    elif args.output is None:
        print_text(out, text)
    else:
        try:
            write_atomic(args.output, text.encode(), mode=umask_mode())
        except UsdtpatchError as exc:
            print(printable(f"usdtpatch: kcheck: {exc}"), file=err)
            return EXIT_UNUSABLE
    return EXIT_FAIL if rep.problems else EXIT_OK
