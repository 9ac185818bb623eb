"""`usdtpatch plan FILE [--trampoline ADDR | --maps FILE | --pid PID] [--load-base ADDR]
[--form nop5|nop10] [--probe PATTERN] [--json]`: the kernel's write sequences for every probe
site (or those --probe selects)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import IO, Any

from usdtpatch import api
from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE, error_line
from usdtpatch.errors import UsdtpatchError
from usdtpatch.report.listing import PROBE_PATTERN_HELP, probe_matches
from usdtpatch.sequences.plan import Plan, SitePlan, plan_json
from usdtpatch.sequences.sequences import PROTOCOL_NOP5, PROTOCOL_NOP10, Sequence
from usdtpatch.x86.describe import describe


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
        out.write(render_plan(plan))
    return EXIT_OK


def _state_line(state: bytes, address: int, note: str) -> str:
    text = describe(state, address, 1)
    if state[0] == 0xCC:
        text = "int3 (trap)"
    return f"    {state.hex(' '):<30} {text:<34} {note}".rstrip()


def render_sequence(seq: Sequence) -> list[str]:
    lines = [f"  {seq.name}:", _state_line(seq.start, seq.address, "")]
    for i, st in enumerate(seq.steps, 1):
        check = "" if st.expect_byte0 is None else f", checks byte 0 == {st.expect_byte0:02x}"
        note = (f"<- step {i}: +{st.offset} := {st.data.hex(' ')} ({st.what}{check}"
                f"{', serialize' if st.serialize else ''})")
        lines.append(_state_line(st.after, seq.address, note))
    return lines


def render_site(site: SitePlan) -> list[str]:
    s = site.sequences
    head = f"{site.probe} at {site.address:#x}"
    if site.file_offset is not None:
        head += f" (file offset {site.file_offset:#x})"
    head += f": {site.form}"
    if s is None:
        lines = [head + ", cannot be probed"]
    else:
        if s.trampoline is not None and s.optimize is not None:
            call_end = s.address + (10 if s.protocol == PROTOCOL_NOP10 else 5)
            head += (f", {s.protocol} protocol, trampoline {s.trampoline:#x} "
                     f"(rel32 {s.trampoline - call_end:+#x})")
        else:
            head += ", int3 only"
        if site.guarded:
            head += ", red-zone guarded"
        lines = [head]
        if s.optimize is not None and s.unoptimize is not None:
            lines += render_sequence(s.optimize) + render_sequence(s.unoptimize)
        else:
            lines += render_sequence(s.attach) + render_sequence(s.detach)
    for f in site.findings:
        lines.append(f"  {f.severity.value} [{f.code}] {f.message}" +
                     (f" ({f.hint})" if f.hint else ""))
    return lines


def render_plan(plan: Plan) -> str:
    proto = "nop5 protocol (Linux 6.18)" if plan.protocol == PROTOCOL_NOP5 else \
        "nop10 protocol (EXPERIMENTAL: queued upstream series, unreleased)"
    tr = ", ".join(f"{t:#x}" for t in plan.trampolines) or "none"
    lines = [f"{plan.path}: {len(plan.sites)} site(s), {proto}, load base "
             f"{plan.load_base:#x} ({plan.load_base_source}), trampoline {tr} "
             f"(from {plan.trampoline_source})"]
    for f in plan.findings:
        lines.append(f"{f.severity.value} [{f.code}] {f.message}")
    for site in plan.sites:
        lines += render_site(site)
    return "\n".join(lines) + "\n"
