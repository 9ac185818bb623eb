"""`usdtpatch check FILE... [--json | --sarif | --html] [--report FILE] [--fail-on LEVEL]
[--summary] [--form F] [--kernel K] [--redzone-guard G] [--fork-guard G] [--calls C]
[--probe PATTERN]`.

The outcomes predict what `rewrite` decides with the same --form, --kernel, --redzone-guard,
--fork-guard and --calls (rewrite's choices and meanings; check's --form defaults to nop5, a
Linux 6.18 target, instead of asking the running kernel: `--form auto` asks it as rewrite
does).

The format switches never take a value (so none can take a FILE for its output): the report
goes to stdout, or with `--report FILE` to FILE, in the format of the switch or else of FILE's
extension (.json, .sarif, .html), the convention of `rewrite --report` and `post-link --report`.

Exit status: 0 when no finding reaches --fail-on (default: error), 1 when one does, 2 when an
input is unusable (not ELF, unreadable) or the usage is wrong.

Deferred imports: json (not for the table), dataclasses (only to keep the sites --probe
selects), report/sarif.py, report/html.py and report/show.py (only for their format),
report/rewrite.py (report_kind, only with --report), report/text.py (only for the table).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import IO, Any

from usdtpatch import api
from usdtpatch.api import (
    CALL_CHOICES,
    KERNEL_CHOICES,
    NOT_FOUND,
    ForkGuard,
    Form,
    Guard,
    OutputError,
    UsdtpatchError,
    check_output,
    demangle,
    demangle_unavailable,
    no_match,
    umask_mode,
    write_atomic,
)
from usdtpatch.cli.common import EXIT_FAIL, EXIT_OK, EXIT_UNUSABLE, error_line, printable
from usdtpatch.report.checkjson import (
    SiteWriter,
    check_document,
    document_findings,
    json_pieces,
    reaches,
    result_json,
)
from usdtpatch.report.listing import PROBE_PATTERN_HELP, probe_matches

FAIL_LEVELS = ("info", "warning", "error", "never")


def register(sub: Any) -> None:
    p = sub.add_parser("check", help="judge every probe site as an optimized-uprobe candidate")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="ELF executables, shared libraries or other linked files")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="format", action="store_const", const="json",
                     help="the versioned JSON document instead of the table")
    fmt.add_argument("--sarif", dest="format", action="store_const", const="sarif",
                     help="SARIF 2.1.0 instead of the table (for CI code-scanning views)")
    fmt.add_argument("--html", dest="format", action="store_const", const="html",
                     help="a self-contained HTML page instead of the table")
    p.add_argument("--report", metavar="FILE",
                   help="write the JSON, SARIF or HTML report to FILE instead of stdout (the "
                        "format: --json/--sarif/--html, else FILE's extension: .json, "
                        ".sarif, .html)")
    p.add_argument("--fail-on", choices=FAIL_LEVELS, default="error",
                   help="exit 1 when a finding has this severity or worse (default: error)")
    p.add_argument("--summary", action="store_true", help="only the summary line per file")
    p.add_argument("--form", choices=["auto", *(f.value for f in Form)], default="nop5",
                   help="predict rewrite --form F (default nop5, a fixed nop5-generation target, "
                        "not rewrite's auto: a check in CI must not depend on the runner's "
                        "kernel, and auto refuses to check on a kernel that optimizes "
                        "nothing; auto: the running kernel's, as rewrite)")
    p.add_argument("--kernel", choices=list(KERNEL_CHOICES), default=None,
                   help="with --form auto: the kernel generation the binary will run on")
    p.add_argument("--redzone-guard", choices=[g.value for g in Guard],
                   default=Guard.AUTO.value, help="predict rewrite --redzone-guard G")
    p.add_argument("--fork-guard", choices=[g.value for g in ForkGuard],
                   default=ForkGuard.AUTO.value, help="predict rewrite --fork-guard G")
    p.add_argument("--calls", choices=list(CALL_CHOICES), default="auto",
                   help="predict rewrite --calls C")
    p.add_argument("--probe", action="append", default=[], metavar="PATTERN",
                   help=f"only these probes' sites (the file's own findings stay): "
                        f"{PROBE_PATTERN_HELP} (repeatable; patterns that select no probe "
                        f"of any FILE are an error, exit 2)")
    p.set_defaults(func=run)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The rewrite options check predicts (api.check's keyword arguments)."""
    return {"form": args.form, "kernel": args.kernel, "redzone_guard": args.redzone_guard,
            "fork_guard": args.fork_guard, "calls": args.calls}


def build_document(paths: list[str], err: IO[str] | None = None,
                   fail_on: str = "error",
                   views: list[list[dict[str, Any]]] | None = None,
                   options: dict[str, Any] | None = None,
                   probes: list[str] | None = None) -> dict[str, Any]:
    """The check document of `paths`; unusable inputs go to its `errors` (and to `err`).
    `views`, when given, receives the `show` documents of every site of each file (for the
    HTML page), in the order of the document's files. `options`: api.check's rewrite
    options; `probes`: --probe's patterns (_selected)."""
    results: list[api.CheckResult] = []
    errors: list[dict[str, str]] = []
    for path in paths:
        try:
            results.append(api.check(path, **(options or {})))
        except UsdtpatchError as exc:
            errors.append({"path": path, "error": str(exc)})
            if err is not None:
                error_line(path, exc, err)
    if probes:
        results = _selected(results, probes, errors, err)
    functions = [s.probe.function for r in results for s in r.report.sites
                 if s.probe.function]
    names = demangle(functions)
    if err is not None and demangle_unavailable(functions):
        print(f"usdtpatch: note: {NOT_FOUND}", file=err)
    if views is not None:
        from usdtpatch.report.show import site_views

        for r in results:
            try:
                views.append(site_views(r.path, r.report))
            except UsdtpatchError:  # the page then shows each window's data without it
                views.append([])
    return check_document([result_json(r, names) for r in results], errors, fail_on)


def written_document(paths: list[str], err: IO[str], fail_on: str, table: bool,
                     options: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """build_document's document, made as each site is decided (for the table, its sites'
    rows; for json_pieces, their entries Encoded); and whether a finding reaches
    `fail_on`."""
    written = SiteWriter(table)
    files: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    failed = False
    for path in paths:
        try:
            r = api.check_keeping(path, written.start, **options)
        except UsdtpatchError as exc:
            errors.append({"path": path, "error": str(exc)})
            error_line(path, exc, err)
            continue
        files.append(written.file(r))
        failed = failed or reaches(list(r.findings), fail_on)
    if demangle_unavailable(written.functions):
        print(f"usdtpatch: note: {NOT_FOUND}", file=err)
    return check_document(files, errors, fail_on), failed


def _selected(results: list[api.CheckResult], probes: list[str],
              errors: list[dict[str, str]], err: IO[str] | None) -> list[api.CheckResult]:
    """The results with only the sites `probes` select; when they select none in any file,
    each file is an error (its line names the patterns and the probes there are)."""
    import dataclasses

    kept = [dataclasses.replace(r, report=dataclasses.replace(r.report, sites=tuple(
        s for s in r.report.sites
        if any(probe_matches(p, s.probe.provider, s.probe.name) for p in probes))))
        for r in results]
    if any(r.report.sites for r in kept):
        return kept
    for r in results:
        line = no_match(r.path, probes, (s.probe.probe_id for s in r.report.sites))
        errors.append({"path": r.path, "error": line})
        if err is not None:
            print(printable(f"usdtpatch: {line}"), file=err)
    return []


def exit_status(doc: dict[str, Any], fail_on: str) -> int:
    if doc["errors"]:
        return EXIT_UNUSABLE
    return EXIT_FAIL if reaches(document_findings(doc), fail_on) else EXIT_OK


def check_and_render(path: str, out: IO[str], err: IO[str], fail_on: str = "error") -> int:
    """For `demo` and scripts: check one file, print the table and summary, return the status."""
    from usdtpatch.report.text import print_check

    doc = build_document([path], err, fail_on)
    print_check(out, doc)
    return exit_status(doc, fail_on)


def _emit(text: str | Iterable[str], target: str, out: IO[str]) -> None:
    pieces = [text] if isinstance(text, str) else text
    if target == "-":
        for piece in pieces:
            out.write(piece)
    else:  # a report, as open() makes
        write_atomic(target, b"".join([p.encode() for p in pieces]), mode=umask_mode())


def report_format(fmt: str | None, report: str | None) -> str | None:
    """The report format: the switch's, else (with --report) FILE's extension; None for the
    table. Raises OutputError for a --report FILE whose extension names no format."""
    if fmt is not None or report is None:
        return fmt
    from usdtpatch.report.rewrite import report_kind

    try:
        return report_kind(report).lstrip(".")
    except OutputError as exc:
        raise OutputError(f"{exc}; or give --json, --sarif or --html") from None


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    report: str | None = args.report
    try:
        fmt = report_format(args.format, report)
        if report is not None and report != "-":  # refused before any work if it is an
            check_output(report, args.files, can_in_place=False)  # input or not a file
    except UsdtpatchError as exc:
        print(printable(f"usdtpatch: check: {exc}"), file=err)
        return EXIT_UNUSABLE
    target = "-" if report is None else report
    if fmt in ("json", None) and not args.probe:  # written site by site
        doc, failed = written_document(args.files, err, args.fail_on, fmt is None,
                                       _options(args))
        if fmt == "json":
            _emit(json_pieces(doc), target, out)
        else:
            from usdtpatch.report.text import print_check

            print_check(out, doc, summary_only=args.summary, forms_line=not args.summary)
        return EXIT_UNUSABLE if doc["errors"] else EXIT_FAIL if failed else EXIT_OK
    views: list[list[dict[str, Any]]] | None = [] if fmt == "html" else None
    doc = build_document(args.files, err, args.fail_on, views, _options(args), args.probe)
    if fmt == "json":
        _emit(json_pieces(doc), target, out)
    elif fmt == "sarif":
        from usdtpatch.report.sarif import sarif_document

        _emit(json_pieces(sarif_document(doc)), target, out)
    elif fmt == "html":
        from usdtpatch.report.html import html_page

        _emit(html_page(doc, views), target, out)
    else:
        from usdtpatch.report.text import print_check

        print_check(out, doc, summary_only=args.summary, forms_line=not args.summary)
    return exit_status(doc, args.fail_on)
