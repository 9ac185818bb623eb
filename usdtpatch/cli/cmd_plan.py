"""`usdtpatch plan FILE [--trampoline ADDR | --maps FILE | --pid PID] [--load-base ADDR]
[--kernel nop5|nop10] [--probe PATTERN] [--json]`: the kernel's write sequences for
every probe site (or those --probe selects; a pattern that selects none is an error, exit 2,
as in every command). --form nop5|nop10 is the deprecated spelling of --kernel.

sequences/trampoline.py (api.TASK_SIZE, bound on first use) is loaded only when --trampoline
is given (verify shares these options).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import IO, TYPE_CHECKING, Any

from usdtpatch import api
from usdtpatch.api import GENERATIONS, KERNEL_CHOICES, InputError, UsdtpatchError, no_match
from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE, error_line
from usdtpatch.report.listing import PROBE_PATTERN_HELP, probe_matches
from usdtpatch.report.plan import plan_json, plan_text

if TYPE_CHECKING:
    from usdtpatch.api import Plan


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
    page, task_size = api.PAGE, api.TASK_SIZE  # sequences/trampoline.py, loaded here
    v = _addr(text)
    if not page <= v < task_size:
        raise argparse.ArgumentTypeError(f"{text}: not a user-space address "
                                         f"({page:#x} to {task_size - 1:#x})")
    if v % page:
        raise argparse.ArgumentTypeError(f"{text}: not a page address (a multiple of "
                                         f"{page:#x})")
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
    p.add_argument("--kernel", choices=list(KERNEL_CHOICES), default=None,
                   help="the kernel generation whose write protocol is planned, as rewrite's "
                        f"--kernel: {_GENERATIONS_HELP} (default {OPTIMIZING[0]})")
    p.add_argument("--form", choices=list(OPTIMIZING), default=None,
                   help="deprecated spelling of --kernel: --form names a site form in "
                        "rewrite and check")


# the optimizing generations, by name (the first is the default), and --kernel's help
OPTIMIZING = tuple(g.name for g in GENERATIONS if g.optimizes)
_GENERATIONS_HELP = "; ".join(
    f"{g.name} ({'/'.join(g.aliases)}; e.g. Linux {', '.join(g.examples)})"
    for g in GENERATIONS if g.optimizes)


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="the kernel's write sequences for every probe site")
    p.add_argument("file", metavar="FILE", help="the ELF file whose sites are planned")
    add_placement_args(p)
    add_probe_arg(p, "planned")
    p.add_argument("--json", action="store_true", help="print the versioned plan document")
    p.set_defaults(func=run)


def placement(args: argparse.Namespace, err: IO[str] | None = None) -> dict[str, Any]:
    """The placement options of plan and verify, as keyword arguments of usdtpatch.api
    (the deprecated --form says so on `err`, once)."""
    kernel = args.kernel
    if args.form is not None:
        if err is not None:
            print(f"usdtpatch: {args.command}: --form {args.form} is deprecated here, give "
                  f"--kernel {args.form} (--form names a site form in rewrite and "
                  f"check)", file=err)
        if kernel is not None and _name(kernel) != args.form:
            raise InputError(f"--form {args.form} contradicts --kernel {kernel}")
        kernel = args.form
    return {"form": _name(kernel or OPTIMIZING[0]), "load_base": args.load_base,
            "trampoline": args.trampoline, "maps": args.maps, "pid": args.pid}


def _name(kernel: str) -> str:
    """The generation `kernel` (a name or an alias of --kernel's choices) names."""
    return next(g.name for g in GENERATIONS if kernel == g.name or kernel in g.aliases)


def add_probe_arg(p: argparse.ArgumentParser, what: str) -> None:
    """--probe, as every command has it (repeatable here)."""
    p.add_argument("--probe", action="append", default=[], metavar="PATTERN",
                   help=f"only these probes' sites {what}: {PROBE_PATTERN_HELP} (repeatable; "
                        f"a pattern that selects no probe is an error, exit 2)")


def select_sites(plan: Plan, path: str, patterns: list[str]) -> Plan:
    """`plan` with only the sites of the probes `patterns` select (all without patterns);
    InputError naming the patterns and the probes there are when they select none."""
    if not patterns:
        return plan
    sites = tuple(s for s in plan.sites
                  if any(probe_matches(p, *s.probe.split(":", 1)) for p in patterns))
    if not sites:
        raise InputError(no_match(path, patterns, (s.probe for s in plan.sites)))
    return dataclasses.replace(plan, sites=sites)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    try:
        plan = select_sites(api.plan(args.file, **placement(args, err)), args.file, args.probe)
    except UsdtpatchError as exc:
        error_line(args.file, exc, err)
        return EXIT_UNUSABLE
    if args.json:
        json.dump(plan_json(plan), out, indent=2)
        out.write("\n")
    else:
        out.write(plan_text(plan))
    return EXIT_OK
