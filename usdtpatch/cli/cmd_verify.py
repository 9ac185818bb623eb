"""`usdtpatch verify FILE [--plan PLAN.json | --protocol PROTOCOL.toml] [--probe PATTERN]
[--json]`: run every
torn state of every write sequence in the bundled emulator; a verdict per site, exit 1 if any
site fails.

`summarize(path)` is what `usdtpatch demo` calls: plan + verify one file, rendered as text.

sequences/protocols/ (keystone) is loaded only for --protocol (api.read_protocol, and
api.ProtocolError bound on first use).
"""

from __future__ import annotations

import argparse
import json
from typing import IO, TYPE_CHECKING, Any

from usdtpatch import api
from usdtpatch.api import UsdtpatchError
from usdtpatch.cli.cmd_plan import add_placement_args, add_probe_arg, placement, select_sites
from usdtpatch.cli.common import EXIT_FAIL, EXIT_OK, EXIT_UNUSABLE, error_line
from usdtpatch.report.text import print_text
from usdtpatch.report.verify import demo_text, verify_json, verify_text

if TYPE_CHECKING:
    from usdtpatch.api import Plan, Protocol


def register(sub: Any) -> None:
    p = sub.add_parser("verify", help="check write sequences in the bundled emulator "
                                      "(exit 1 if a site fails)")
    p.add_argument("file", metavar="FILE", help="the ELF file whose sites are verified")
    p.add_argument("--plan", metavar="PLAN.json",
                   help="verify this plan (from `usdtpatch plan --json` or anyone else) "
                        "instead of planning FILE now")
    p.add_argument("--protocol", metavar="PROTOCOL.toml",
                   help="run this write protocol (a protocol file: usdtpatch/sequences/protocols/"
                        "nop5.toml is the kernel's) on every site instead of the plan's "
                        "sequences; its model replaces --kernel")
    add_placement_args(p)
    add_probe_arg(p, "verified")
    p.add_argument("--json", action="store_true", help="print a versioned JSON document")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    if args.plan and args.protocol:
        print("usdtpatch: verify: give --plan or --protocol, not both", file=err)
        return EXIT_UNUSABLE
    # An error line names the file it is about: the plan or protocol file for its own errors
    # (a protocol's statements are assembled at FILE's sites: still the protocol's), FILE for
    # the rest.
    plan: Plan | None = None
    proto: Protocol | None = None
    try:
        if args.plan:
            plan = api.read_plan(args.plan)
        elif args.protocol:
            proto = api.read_protocol(args.protocol)
    except UsdtpatchError as exc:
        error_line(args.plan or args.protocol, exc, err)
        return EXIT_UNUSABLE
    try:
        if proto is not None:
            try:
                plan = api.plan(args.file, **{**placement(args, err), "protocol": proto})
            except api.ProtocolError as exc:
                error_line(args.protocol, exc, err)
                return EXIT_UNUSABLE
        if plan is None and args.probe:
            plan = api.plan(args.file, **placement(args, err))
        if plan is not None:
            plan = select_sites(plan, args.file, args.probe)
        rep = (api.verify(args.file, plan=plan) if plan is not None
               else api.verify(args.file, **placement(args, err)))
    except UsdtpatchError as exc:
        error_line(args.file, exc, err)
        return EXIT_UNUSABLE
    if args.json:
        json.dump(verify_json(rep), out, indent=2)
        out.write("\n")
    else:
        print_text(out, verify_text(rep))
    return EXIT_OK if rep.ok else EXIT_FAIL


def summarize(path: str, form: str = "nop5") -> tuple[int, str]:
    """Plan and verify `path` with defaults; (exit code as `verify` gives it, text summary).

    The text is the plan of the first optimizable site followed by every site's verdict.
    Raises UsdtpatchError on unusable input.
    """
    plan = api.plan(path, form=form)
    rep = api.verify(path, plan=plan)
    return (EXIT_OK if rep.ok else EXIT_FAIL), demo_text(plan, rep)
