"""`usdtpatch show FILE --probe [PROVIDER:]NAME [--json] [--context N]`: the sites of the
probes chosen, each with its patch window before and after (the document: report/show.py).

Deferred imports: report/render.py (rich) and report/text.py, only for the text (not for
--json).
"""

from __future__ import annotations

import argparse
import json
from typing import IO, Any

from usdtpatch import api
from usdtpatch.api import InputError, UsdtpatchError, no_match
from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE, error_line
from usdtpatch.report.listing import PROBE_PATTERN_HELP, probe_matches
from usdtpatch.report.show import show_document, site_views


def register(sub: Any) -> None:
    p = sub.add_parser("show", help="show one probe site and its patch window, before and after")
    p.add_argument("file", metavar="FILE", help="the ELF file holding the probe")
    p.add_argument("--probe", required=True, metavar="PATTERN",
                   help=f"the probes to show (every site of each): {PROBE_PATTERN_HELP}")
    p.add_argument("--context", type=int, default=3, metavar="N",
                   help="instructions shown before and after the window (default 3)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    try:
        docs = _site_docs(args)
    except UsdtpatchError as exc:
        error_line(args.file, exc, err)
        return EXIT_UNUSABLE
    if args.json:
        json.dump(show_document(docs), out, indent=2)
        out.write("\n")
    else:
        from usdtpatch.report.text import print_show

        print_show(out, docs)
    return EXIT_OK


def _site_docs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of every site of the probe (raises UsdtpatchError, naming what is wrong)."""
    report = api.check(args.file).report
    sites = [s for s in report.sites
             if probe_matches(args.probe, s.probe.provider, s.probe.name)]
    if not sites:
        raise InputError(no_match(args.file, [args.probe],
                                  (s.probe.probe_id for s in report.sites)))
    return site_views(args.file, report, sites, args.context)


