"""`usdtpatch plan FILE [--trampoline ADDR | --maps FILE | --pid PID] [--load-base ADDR]
[--form nop5|nop10] [--probe PATTERN] [--json]`: the kernel's write sequences for every probe
site (or those --probe selects).

Deferred imports: kernelfacts.py and sequences/trampoline.py (PAGE, TASK_SIZE), only when
--trampoline is given (verify shares these options).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import IO, Any

from usdtpatch import api
from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE, error_line
from usdtpatch.errors import UsdtpatchError
from usdtpatch.report.listing import PROBE_PATTERN_HELP, probe_matches
from usdtpatch.report.plan import plan_json, plan_text
from usdtpatch.sequences.sequences import PROTOCOL_NOP5, PROTOCOL_NOP10


def _addr(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an address: {text!r}") from exc
    if v < 0:
        raise argparse.ArgumentTypeError(f"negative address: {text!r}")
    return v


def _trampoline(text: str) -> int:
    """--trampoline: a page address in user space (as api.plan checks it)."""
    from usdtpatch.kernelfacts import PAGE
    from usdtpatch.sequences.trampoline import TASK_SIZE

    v = _addr(text)
    if not PAGE <= v < TASK_SIZE:
        raise argparse.ArgumentTypeError(f"{text}: not a user-space address "
                                         f"({PAGE:#x} to {TASK_SIZE - 1:#x})")
    if v % PAGE:
        raise argparse.ArgumentTypeError(f"{text}: not a page address (a multiple of "
                                         f"{PAGE:#x})")
    return v


def add_placement_args(p: argparse.ArgumentParser) -> None:
    """The options plan and verify share: where the file is loaded and its trampoline."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--trampoline", type=_trampoline, metavar="ADDR",
                       help="use this trampoline page for every site")
    where.add_argument("--maps", metavar="FILE",
                       help="predict the trampoline from a /proc/PID/maps snapshot")
    where.add_argument("--pid", type=int, metavar="PID",
                       help="predict the trampoline from a live process's maps")
    p.add_argument("--load-base", type=_addr, metavar="ADDR",
                   help="where the file is loaded (default: from the maps, else "
                        "0x555555554000 for PIE, 0 for non-PIE)")
    p.add_argument("--form", choices=(PROTOCOL_NOP5, PROTOCOL_NOP10), default=PROTOCOL_NOP5,
                   help="kernel protocol: nop5 (Linux 6.18) or nop10 (EXPERIMENTAL: queued "
                        "upstream series)")


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="the kernel's write sequences for every probe site")
    p.add_argument("file", metavar="FILE", help="the ELF file whose sites are planned")
    add_placement_args(p)
    p.add_argument("--probe", action="append", default=[], metavar="PATTERN",
                   help=f"only these probes' sites: {PROBE_PATTERN_HELP} (repeatable)")
    p.add_argument("--json", action="store_true", help="print the versioned plan document")
    p.set_defaults(func=run)


def placement(args: argparse.Namespace) -> dict[str, Any]:
    """The placement options of plan and verify, as keyword arguments of usdtpatch.api."""
    return {"form": args.form, "load_base": args.load_base, "trampoline": args.trampoline,
            "maps": args.maps, "pid": args.pid}


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    try:
        plan = api.plan(args.file, **placement(args))
    except UsdtpatchError as exc:
        error_line(args.file, exc, err)
        return EXIT_UNUSABLE
    if args.probe:
        plan = dataclasses.replace(plan, sites=tuple(
            s for s in plan.sites
            if any(probe_matches(p, *s.probe.split(":", 1)) for p in args.probe)))
    if args.json:
        json.dump(plan_json(plan), out, indent=2)
        out.write("\n")
    else:
        out.write(plan_text(plan))
    return EXIT_OK
