"""`usdtpatch explain [CODE]`: a finding code's documentation, as `rustc --explain` does.

The text (report/explain.py) is docs/findings.md's section of the code, read from the copy
shipped in the package, so an installed wheel explains every code it can report.
Without CODE: every registered code with its severity and title; `explain assumptions`: what
a proved detour rests on (the registry of usdtpatch/prove/assumptions.py), which rewrite's
summary points at. An unknown code is exit 2,
with the nearest registered codes.
"""

from __future__ import annotations

import argparse
import difflib
from typing import IO, Any

from usdtpatch.api import CODES, RENAMED
from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE, printable
from usdtpatch.report.explain import (
    ASSUMPTIONS_TOPIC,
    assumptions_text,
    codes_text,
    explanation,
)
from usdtpatch.report.text import print_text


def register(sub: Any) -> None:
    p = sub.add_parser("explain", help="print the documentation of a finding code")
    p.add_argument("code", nargs="?", metavar="CODE",
                   help="a finding code as reports print it (e.g. red-zone-live); or "
                        "'assumptions': what a proved detour rests on; without it, every "
                        "code with its severity and title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    if args.code is None:
        print_text(out, codes_text())
        return EXIT_OK
    code = args.code.strip().strip("[]`")
    if code == ASSUMPTIONS_TOPIC:
        print_text(out, assumptions_text())
        return EXIT_OK
    if RENAMED.get(code, code) not in CODES:
        near = difflib.get_close_matches(RENAMED.get(code, code), list(CODES), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(near)}?)" if near else \
            " (`usdtpatch explain` lists every code)"
        print(printable(f"usdtpatch: explain: no finding code {args.code!r}{hint}"), file=err)
        return EXIT_UNUSABLE
    print_text(out, explanation(code))
    return EXIT_OK
