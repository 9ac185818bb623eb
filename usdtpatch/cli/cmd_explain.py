"""`usdtpatch explain [CODE]`: a finding code's documentation, as `rustc --explain` does.

The text is docs/findings.md's section of the code, read from the copy shipped in the package
(usdtpatch.findings.documentation), so an installed wheel explains every code it can report.
Without CODE: every registered code with its severity and title. An unknown code is exit 2,
with the nearest registered codes.
"""

from __future__ import annotations

import argparse
import difflib
from typing import IO, Any

from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE, printable
from usdtpatch.findings import CODES, RENAMED, documentation, lookup


def register(sub: Any) -> None:
    p = sub.add_parser("explain", help="print the documentation of a finding code")
    p.add_argument("code", nargs="?", metavar="CODE",
                   help="a finding code as reports print it (e.g. red-zone-live); without "
                        "it, every code with its severity and title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    if args.code is None:
        width = max(map(len, CODES))
        for c in sorted(CODES.values(), key=lambda c: c.code):
            out.write(f"{c.code:<{width}}  {c.severity.value:<7}  {c.title}\n")
        return EXIT_OK
    code = args.code.strip().strip("[]`")
    renamed = RENAMED.get(code)
    if renamed is not None:
        out.write(f"{code} is the earlier name of {renamed}\n\n")
        code = renamed
    if code not in CODES:
        near = difflib.get_close_matches(code, list(CODES), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(near)}?)" if near else \
            " (`usdtpatch explain` lists every code)"
        print(printable(f"usdtpatch: explain: no finding code {args.code!r}{hint}"), file=err)
        return EXIT_UNUSABLE
    entry = lookup(code)
    text = documentation(code)
    out.write(f"{code} ({entry.severity.value}): {entry.title}\n\n")
    if text:
        out.write(text + "\n")
    else:  # the page is not shipped with this installation
        out.write(f"- hint: {entry.hint or 'none'}\n")
    return EXIT_OK
