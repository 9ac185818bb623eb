"""`usdtpatch demo [FILE]`: the toolkit's main job on a bundled fixture, step by step.

Each capability adds its step here, so that `make demo` always shows the whole toolkit.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import IO, Any

from usdtpatch.cli import cmd_list
from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE

DEMO_FIXTURE = "fixtures/bin/demo"


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="show the toolkit at work on a bundled fixture")
    p.add_argument("file", nargs="?", metavar="FILE", help=f"default: {DEMO_FIXTURE}")
    p.set_defaults(func=run)


def _default_demo_file() -> str | None:
    candidate = Path(__file__).resolve().parents[2] / DEMO_FIXTURE
    return str(candidate) if candidate.is_file() else None


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    target = args.file or _default_demo_file()
    if target is None:
        print(f"usdtpatch: demo: no FILE given and {DEMO_FIXTURE} is not beside the package "
              f"(run it from a source checkout: make demo)", file=err)
        return EXIT_UNUSABLE
    from usdtpatch.report.render import make_console

    console = make_console(out)
    steps: list[tuple[str, int]] = []
    console.rule(f"1. list: the probes of {target}")
    rc = cmd_list.run(argparse.Namespace(files=[target], json=False, provider=None, probe=None),
                      out, err)
    steps.append(("list", rc))
    failed = [name for name, code in steps if code != EXIT_OK]
    console.rule("done" if not failed else f"failed: {', '.join(failed)}")
    return EXIT_OK if not failed else EXIT_UNUSABLE
