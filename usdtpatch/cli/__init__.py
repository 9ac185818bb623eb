"""The command line: `main(argv) -> int` and one module per subcommand (cli/cmd_*.py).

The cli package is the one place that prints and that turns exceptions into exit codes:
0 success, 1 a check failed (findings at or above --fail-on, a verification failed),
2 unusable input or a usage error, 3 an internal error (a bug: one line, no traceback, unless
USDTPATCH_DEBUG is set). Each subcommand module has `register(subparsers)`, which
adds its parser and sets `func(args, out, err) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import IO

from usdtpatch import __version__
from usdtpatch.cli.common import EXIT_INTERNAL, EXIT_OK, EXIT_UNUSABLE
from usdtpatch.errors import UsdtpatchError

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
}


def _modules_for(argv: list[str] | None) -> list[str]:
    words = sys.argv[1:] if argv is None else argv
    command = next((w for w in words if not w.startswith("-")), None)
    if command in COMMANDS:
        return [COMMANDS[command]]
    return list(dict.fromkeys(COMMANDS.values()))  # help, --version or a typo: all of them


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="usdtpatch",
        description="Read, check and rewrite USDT probe sites for Linux optimized uprobes.")
    parser.add_argument("--version", action="version", version=f"usdtpatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _modules_for(argv):
        importlib.import_module(f"usdtpatch.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None, out: IO[str] | None = None,
         err: IO[str] | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed its message
        return EXIT_UNUSABLE if exc.code not in (0, None) else EXIT_OK
    if args.command is None:
        parser.print_help(out)
        return EXIT_UNUSABLE
    try:
        rc: int = args.func(args, out, err)
        return rc
    except UsdtpatchError as exc:
        print(f"usdtpatch: {exc}", file=err)
        return EXIT_UNUSABLE
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        if os.environ.get("USDTPATCH_DEBUG"):
            raise
        print(f"usdtpatch: internal error: {type(exc).__name__}: {exc} (a bug: please report "
              f"it with the input; USDTPATCH_DEBUG=1 shows the traceback)", file=err)
        return EXIT_INTERNAL
