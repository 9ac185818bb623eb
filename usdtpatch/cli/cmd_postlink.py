"""`usdtpatch post-link FILE [-o OUT] [--check-only] ...`: the build step
(usdtpatch.integrate.step does it; this module parses and prints its lines)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import IO, Any

from usdtpatch.api import UsdtpatchError
from usdtpatch.cli.common import error_line
from usdtpatch.integrate.step import (
    FAIL_LEVELS,
    FORK_GUARDS,
    FORMS,
    GUARDS,
    StepOptions,
    run_step,
)
from usdtpatch.report.text import print_text


def register(sub: Any) -> None:
    p = sub.add_parser(
        "post-link", help="the build step: rewrite or check one linked file, write a report, "
                          "fail on findings")
    p.add_argument("file", metavar="FILE", help="the file the linker has just written")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write the result here (default: rewrite FILE in place)")
    p.add_argument("--check-only", action="store_true",
                   help="do not rewrite: only check FILE (and fail on findings)")
    p.add_argument("--form", choices=FORMS, default="nop5", help="site form (default nop5)")
    p.add_argument("--redzone-guard", choices=GUARDS, default="auto",
                   help="as for `rewrite` (default auto)")
    p.add_argument("--fork-guard", choices=FORK_GUARDS, default=None,
                   help="as for `rewrite` (default: rewrite's default)")
    p.add_argument("--report", metavar="JSON",
                   help="write the JSON report here and the HTML page beside it (.html)")
    p.add_argument("--fail-on", choices=FAIL_LEVELS, default="error",
                   help="fail (exit 1) when a finding has this severity or worse "
                        "(default: error)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the emulator's equivalence check of each detour")
    p.add_argument("--keep-on-failure", action="store_true",
                   help="keep FILE when a rewrite in place fails (default: remove it, so the "
                        "next build retries; --check-only never removes FILE)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    opts = StepOptions(mode="check" if args.check_only else "rewrite", form=args.form,
                       redzone_guard=args.redzone_guard, fork_guard=args.fork_guard,
                       fail_on=args.fail_on,
                       verify=not args.no_verify, keep_on_failure=args.keep_on_failure)
    if args.output is not None and Path(args.output).resolve() == Path(args.file).resolve():
        print(f"usdtpatch: post-link: output {args.output} is the input; leave out -o to "
              f"rewrite in place", file=err)
        return 2
    try:
        res = run_step(args.file, args.output, opts, args.report, log=None)
    except UsdtpatchError as exc:
        error_line(args.file, exc, err)
        return 2
    print_text(err if res.failed else out, "".join(f"{line}\n" for line in res.lines))
    return 1 if res.failed else 0
