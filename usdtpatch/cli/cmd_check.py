"""`usdtpatch check FILE... [--json | --sarif [OUT] | --html OUT] [--fail-on LEVEL] [--summary]`.

Exit status: 0 when no finding reaches --fail-on (default: error), 1 when one does, 2 when an
input is unusable (not ELF, unreadable) or the usage is wrong.
"""

from __future__ import annotations

import argparse
import json
from typing import IO, Any

from usdtpatch.cli.common import EXIT_FAIL, EXIT_OK, EXIT_UNUSABLE, error_line, load
from usdtpatch.elf.demangle import demangle
from usdtpatch.errors import UsdtpatchError
from usdtpatch.io import write_atomic
from usdtpatch.report.checkjson import (
    check_document,
    check_file_json,
    document_findings,
    reaches,
)
from usdtpatch.sites.check import CheckReport, check

FAIL_LEVELS = ("info", "warning", "error", "never")


def register(sub: Any) -> None:
    p = sub.add_parser("check", help="judge every probe site as an optimized-uprobe candidate")
    p.add_argument("files", nargs="+", metavar="FILE")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print a versioned JSON document")
    fmt.add_argument("--sarif", nargs="?", const="-", metavar="OUT",
                     help="write SARIF 2.1.0 to OUT (default: stdout)")
    fmt.add_argument("--html", metavar="OUT", help="write a self-contained HTML page to OUT "
                                                   "('-' for stdout)")
    p.add_argument("--fail-on", choices=FAIL_LEVELS, default="error",
                   help="exit 1 when a finding has this severity or worse (default: error)")
    p.add_argument("--summary", action="store_true", help="only the summary line per file")
    p.set_defaults(func=run)


def check_path(path: str) -> CheckReport:
    """Load and check one file (raises UsdtpatchError when it is unusable)."""
    return check(load(path))


def build_document(paths: list[str], err: IO[str] | None = None,
                   fail_on: str = "error") -> dict[str, Any]:
    """The check document of `paths`; unusable inputs go to its `errors` (and to `err`)."""
    files: list[tuple[str, CheckReport]] = []
    errors: list[dict[str, str]] = []
    for path in paths:
        try:
            files.append((path, check_path(path)))
        except UsdtpatchError as exc:
            errors.append({"path": path, "error": str(exc)})
            if err is not None:
                error_line(path, exc, err)
    names = demangle([s.probe.function for _, r in files for s in r.sites if s.probe.function])
    return check_document([check_file_json(p, r, names) for p, r in files], errors, fail_on)


def exit_status(doc: dict[str, Any], fail_on: str) -> int:
    if doc["errors"]:
        return EXIT_UNUSABLE
    return EXIT_FAIL if reaches(document_findings(doc), fail_on) else EXIT_OK


def check_and_render(path: str, out: IO[str], err: IO[str], fail_on: str = "error") -> int:
    """For `demo` and scripts: check one file, print the table and summary, return the status."""
    from usdtpatch.report.render import make_console, render_check

    doc = build_document([path], err, fail_on)
    render_check(make_console(out), doc)
    return exit_status(doc, fail_on)


def _emit(text: str, target: str, out: IO[str]) -> None:
    if target == "-":
        out.write(text)
    else:
        write_atomic(target, text.encode())


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    doc = build_document(args.files, err, args.fail_on)
    if args.json:
        json.dump(doc, out, indent=2)
        out.write("\n")
    elif args.sarif is not None:
        from usdtpatch.report.sarif import sarif_document

        _emit(json.dumps(sarif_document(doc), indent=2) + "\n", args.sarif, out)
    elif args.html is not None:
        from usdtpatch.report.html import html_page

        _emit(html_page(doc), args.html, out)
    else:
        from usdtpatch.report.render import make_console, render_check

        render_check(make_console(out), doc, summary_only=args.summary)
    return exit_status(doc, args.fail_on)
