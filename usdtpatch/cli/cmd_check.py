"""`usdtpatch check FILE... [--json | --sarif [OUT] | --html OUT] [--fail-on LEVEL] [--summary]`.

Exit status: 0 when no finding reaches --fail-on (default: error), 1 when one does, 2 when an
input is unusable (not ELF, unreadable) or the usage is wrong.
"""

from __future__ import annotations

import argparse
from typing import IO, Any

from usdtpatch import api
from usdtpatch.cli.common import EXIT_FAIL, EXIT_OK, EXIT_UNUSABLE, error_line, printable
from usdtpatch.elf.demangle import demangle
from usdtpatch.errors import UsdtpatchError
from usdtpatch.io import check_output, umask_mode, write_atomic
from usdtpatch.report.checkjson import check_document, document_findings, reaches

FAIL_LEVELS = ("info", "warning", "error", "never")


# which site form each kernel generation optimizes (docs/rewrite.md, "Site forms")
FORMS_LINE = ("site forms: Linux 6.18 to 7.2 optimize 5-byte NOPs (rewrite --form nop5); the "
              "queued nop10 series only the 10-byte NOP (--form combo10); rewrite --form auto "
              "takes the running kernel's")


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


def build_document(paths: list[str], err: IO[str] | None = None,
                   fail_on: str = "error",
                   views: list[list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The check document of `paths`; unusable inputs go to its `errors` (and to `err`).
    `views`, when given, receives the `show` documents of every site of each file (for the
    HTML page), in the order of the document's files."""
    results: list[api.CheckResult] = []
    errors: list[dict[str, str]] = []
    for path in paths:
        try:
            results.append(api.check(path))
        except UsdtpatchError as exc:
            errors.append({"path": path, "error": str(exc)})
            if err is not None:
                error_line(path, exc, err)
    names = demangle([s.probe.function for r in results for s in r.report.sites
                      if s.probe.function])
    if views is not None:
        from usdtpatch.cli.cmd_show import site_views

        for r in results:
            try:
                views.append(site_views(r.path, r.report))
            except UsdtpatchError:  # the page then shows each window's data without it
                views.append([])
    return check_document([r.to_json(names) for r in results], errors, fail_on)


def exit_status(doc: dict[str, Any], fail_on: str) -> int:
    if doc["errors"]:
        return EXIT_UNUSABLE
    return EXIT_FAIL if reaches(document_findings(doc), fail_on) else EXIT_OK


def check_and_render(path: str, out: IO[str], err: IO[str], fail_on: str = "error") -> int:
    """For `demo` and scripts: check one file, print the table and summary, return the status."""
    from usdtpatch.report.plain import print_check

    doc = build_document([path], err, fail_on)
    print_check(out, doc)
    return exit_status(doc, fail_on)


def _emit(text: str, target: str, out: IO[str]) -> None:
    if target == "-":
        out.write(text)
    else:
        write_atomic(target, text.encode(), mode=umask_mode())  # a report, as open() makes


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    report = args.sarif if args.sarif is not None else args.html
    if report is not None and report != "-":
        try:  # the report file is refused before any work if it is an input or not a file
            check_output(report, args.files, can_in_place=False)
        except UsdtpatchError as exc:
            print(printable(f"usdtpatch: check: {exc}"), file=err)
            return EXIT_UNUSABLE
    views: list[list[dict[str, Any]]] | None = [] if args.html is not None else None
    doc = build_document(args.files, err, args.fail_on, views)
    if args.json:
        import json  # here: the table form does not pay for importing it

        out.write(json.dumps(doc, indent=2) + "\n")  # one write, not one per token
    elif args.sarif is not None:
        import json

        from usdtpatch.report.sarif import sarif_document

        _emit(json.dumps(sarif_document(doc), indent=2) + "\n", args.sarif, out)
    elif args.html is not None:
        from usdtpatch.report.html import html_page

        _emit(html_page(doc, views), args.html, out)
    else:
        from usdtpatch.report.plain import print_check

        print_check(out, doc, summary_only=args.summary)
        if not args.summary and any(f.get("sites") for f in doc.get("files", [])):
            out.write(FORMS_LINE + "\n")
    return exit_status(doc, args.fail_on)
