"""The command line: `main(argv) -> int` and one module per subcommand (cli/cmd_*.py).

The cli package is the one place that prints and that turns exceptions into exit codes:
0 success, 1 a check failed (findings at or above --fail-on, a verification failed),
2 unusable input or a usage error, 3 an internal error (a bug: one line, no traceback, unless
USDTPATCH_DEBUG is set), 130 interrupted (Ctrl-C; 143 SIGTERM, 129 SIGHUP: one line that
says which outputs were written whole, if any; no partial output). Each
subcommand module has `register(subparsers)`, which adds its parser and sets
`func(args, out, err) -> int`; a command parses, calls usdtpatch.api, and chooses a
rendering from usdtpatch/report/.

Deferred imports: each command's module (only the one run: `list` must not pay for
unicorn), integrate/ (only for
--cmake-dir, --include-dir, --make-include, --debhelper-dir, --rpm-macros), signal (only
while a command runs).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Iterator

from usdtpatch import __version__
from usdtpatch.api import WRITTEN, UsdtpatchError
from usdtpatch.cli.common import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE_CLOSED,
    EXIT_UNUSABLE,
    printable,
    raise_terminated,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`list` does not)
if TYPE_CHECKING:
    from typing import IO, Any

# Subcommand -> the module that registers it, in the order `usdtpatch --help` shows them.
# Only the module of the command being run is imported: `list` must not pay for unicorn.
COMMANDS = {
    "list": "cmd_list",
    "check": "cmd_check",
    "show": "cmd_show",
    "rewrite": "cmd_rewrite",
    "restore": "cmd_rewrite",
    "plan": "cmd_plan",
    "verify": "cmd_verify",
    "dtrace": "cmd_dtrace",
    "demo": "cmd_demo",
    "post-link": "cmd_postlink",
    "kcheck": "cmd_kcheck",
    "bench": "cmd_bench",
    "explain": "cmd_explain",
}


# Commands that make many small objects (libjvm.so's check: ~40,000 decoded instructions) and
# no reference cycles, so the cyclic collector's passes over them are wasted work (about a
# fifth of check's CPU); it is paused while they run, from the import of their command module
# on (importing the analysis modules makes ~13,000 objects: the collector's passes over them
# cost check about 1% of its time). `rewrite` too: its analysis and decisions hold ~10 KB of
# objects per site until the output is written, and the collector's full passes over them
# grew faster than the sites (17 s of a 77 s rewrite of 100,000 probes, 0.04 s of 0.9 s for
# 1,000) while finding nothing to free: a whole verified rewrite of libjvm.so frees ~1,600
# objects by the collector, none in a full pass (docs/performance.md, "Scaling"). The
# verification's worker processes turn it back on (verification/equivalence.py).
_NO_CYCLE_COLLECTION = frozenset({"list", "check", "show", "rewrite"})


def _command_word(argv: list[str] | None) -> str | None:
    """The subcommand named on the command line (the first word that is not an option)."""
    words = sys.argv[1:] if argv is None else argv
    return next((w for w in words if not w.startswith("-")), None)


# The options of `usdtpatch` itself that print and exit (--version, the build systems' paths):
# asked alone, no command's module is imported for them (--version cost 0.5 s of CPU when
# every command was, the emulator's among them)
_PRINT_AND_EXIT = frozenset({"--version", "--cmake-dir", "--include-dir", "--make-include",
                             "--debhelper-dir", "--rpm-macros"})


def _modules_for(argv: list[str] | None) -> list[str]:
    command = _command_word(argv)
    if command in COMMANDS:
        return [COMMANDS[command]]
    words = sys.argv[1:] if argv is None else argv
    if words and all(w in _PRINT_AND_EXIT for w in words):
        return []
    return list(dict.fromkeys(COMMANDS.values()))  # help or a typo: all of them


def help_width() -> int:
    """The width argparse's help is wrapped to, found as shutil.get_terminal_size finds it
    ($COLUMNS, else the terminal on stdout, else 80) less argparse's margin of 2."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns \
                if sys.__stdout__ is not None else 80
        except (AttributeError, ValueError, OSError):  # not a terminal, or closed
            columns = 80
    return columns - 2


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, width=help_width())


class _Parser(argparse.ArgumentParser):
    """argparse's parser with a help formatter that does not import shutil: argparse makes a
    formatter for every add_argument, and its own imports shutil (with bz2, lzma and zlib)
    for the terminal width: ~1.7 ms of every start. Subcommand parsers are of this class too
    (add_subparsers makes them with the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _formatter)
        super().__init__(*args, **kwargs)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="usdtpatch",
        description="Read, check and rewrite USDT probe sites for Linux optimized uprobes.")
    parser.add_argument("--version", action="version", version=f"usdtpatch {__version__}")
    # Paths for build systems (usdtpatch.integrate; docs/build-integration.md): print and exit.
    paths = parser.add_mutually_exclusive_group()
    paths.add_argument("--cmake-dir", action="store_true",
                       help="print the folder of usdtpatchConfig.cmake (find_package)")
    paths.add_argument("--include-dir", action="store_true",
                       help="print the folder to put first on the include path for "
                            "usdtpatch's sys/sdt.h")
    paths.add_argument("--make-include", action="store_true",
                       help="print the GNU make include file (usdtpatch_rewrite, "
                            "usdtpatch_check)")
    paths.add_argument("--debhelper-dir", action="store_true",
                       help="print the folder of dh_usdtpatch and its dh sequence addon "
                            "(for PATH and PERL5LIB: dh $@ --with usdtpatch)")
    paths.add_argument("--rpm-macros", action="store_true",
                       help="print the RPM macros that rewrite the buildroot before strip "
                            "and debuginfo (rpmbuild --load FILE)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _modules_for(argv):
        importlib.import_module(f"usdtpatch.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None, out: IO[str] | None = None,
         err: IO[str] | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    mark = len(WRITTEN)  # usdtpatch.io's record of the outputs put in place
    try:
        with _terminating():
            return _main(argv, out, err)
    except KeyboardInterrupt as exc:
        # an output is renamed into place whole or not at all: say which were written
        written = WRITTEN[mark:]
        with contextlib.suppress(Exception):
            print(printable(interrupted_line(written)), file=err)
        # 128 + the signal, as shells report it (130 for Ctrl-C; SIGTERM and SIGHUP turned
        # into this exception say which: Terminated)
        status: int = getattr(exc, "exit_status", EXIT_INTERRUPTED)
        return status
    finally:
        del WRITTEN[mark:]  # the record is this command's


def pipe_closed(out: IO[str]) -> int:
    """The reader of `out` stopped early (`usdtpatch show F '*' | head -1`): end quietly, as a
    program the pipe's SIGPIPE ends does, with its status (EXIT_PIPE_CLOSED). What is still
    buffered for the pipe is dropped: `out` is pointed at /dev/null, so that the flush at
    exit does not fail again (Python's "Exception ignored" line)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fd = out.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    return EXIT_PIPE_CLOSED


def interrupted_line(written: list[str]) -> str:
    """The one line after an interrupt: that nothing was written, or which outputs were put
    in place whole before it came (their rename was done)."""
    if not written:
        return "usdtpatch: interrupted; nothing was written"
    return (f"usdtpatch: interrupted after {', '.join(written)} "
            f"{'was' if len(written) == 1 else 'were'} written whole (renamed into place)")


@contextlib.contextmanager
def _terminating() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Terminated while a command runs (where they are not
    ignored or handled already; in the main thread only), and are given back after."""
    import signal

    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: left as they are
            if signal.getsignal(sig) is signal.SIG_DFL:
                previous[sig] = signal.signal(sig, raise_terminated)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None, out: IO[str], err: IO[str]) -> int:
    early = _command_word(argv) in _NO_CYCLE_COLLECTION and gc.isenabled()
    if early:
        gc.disable()
    try:
        return _parse_and_run(argv, out, err, early)
    finally:
        if early:
            gc.enable()


def _parse_and_run(argv: list[str] | None, out: IO[str], err: IO[str], early: bool) -> int:
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed its message
        return EXIT_UNUSABLE if exc.code not in (0, None) else EXIT_OK
    if early and args.command not in _NO_CYCLE_COLLECTION:  # not the command guessed
        gc.enable()
    if args.rpm_macros:
        from usdtpatch import integrate

        out.write(integrate.rpm_macros().read_text())
        return EXIT_OK
    if args.cmake_dir or args.include_dir or args.make_include or args.debhelper_dir:
        from usdtpatch import integrate

        where = (integrate.cmake_dir() if args.cmake_dir else
                 integrate.include_dir() if args.include_dir else
                 integrate.debhelper_dir() if args.debhelper_dir else integrate.make_include())
        print(where, file=out)
        return EXIT_OK
    if args.command is None:
        parser.print_help(out)
        return EXIT_UNUSABLE
    paused = args.command in _NO_CYCLE_COLLECTION and gc.isenabled()
    if paused:
        gc.disable()
    try:
        rc: int = args.func(args, out, err)
        return rc
    except UsdtpatchError as exc:
        print(printable(f"usdtpatch: {exc}"), file=err)
        return EXIT_UNUSABLE
    except BrokenPipeError:
        return pipe_closed(out)
    except Exception as exc:
        if os.environ.get("USDTPATCH_DEBUG"):
            raise
        print(printable(f"usdtpatch: internal error: {type(exc).__name__}: {exc} (a bug: "
                        f"please report it with the input; USDTPATCH_DEBUG=1 shows the "
                        f"traceback)"), file=err)
        return EXIT_INTERNAL
    finally:
        if paused:
            gc.enable()
