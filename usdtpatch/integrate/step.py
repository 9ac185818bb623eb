"""The post-link step every build integration runs: `usdtpatch post-link FILE ...`.

One linked file is rewritten (or only checked), the rewritten bytes are checked, a report is
written into the build directory (JSON, and the HTML page beside it), every finding is printed
on one line, and the step fails (exit 1) when a finding reaches `--fail-on`.

The promises the build integrations rely on:

- deterministic: the same input and options give the same output bytes (no time stamps);
- idempotent: a file that carries usdtpatch's marker is left as it is (not even its mtime
  changes when it is rewritten in place), so a second build changes nothing;
- never half-done: the output is written atomically, and only once the check passed. When the
  step fails on a file rewritten in place, that file is removed (as make's .DELETE_ON_ERROR
  does): otherwise the next build would take the linker's output as up to date and pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from usdtpatch import __version__
from usdtpatch.cli.common import error_line
from usdtpatch.errors import OutputError, UsdtpatchError
from usdtpatch.findings import Severity
from usdtpatch.io import check_output, read_source, write_atomic

if TYPE_CHECKING:
    from usdtpatch import api

REPORT_SCHEMA = "usdtpatch/build-report"
REPORT_SCHEMA_VERSION = 1
FORMS = ("nop5", "combo5", "combo10")
GUARDS = ("auto", "always", "never")
FAIL_LEVELS = ("info", "warning", "error", "never")
MODES = ("rewrite", "check")
FORK_GUARDS = ("auto", "always", "never")


@dataclass(frozen=True, slots=True)
class StepOptions:
    """What one build step does; the defaults are the command line's."""

    mode: str = "rewrite"
    form: str = "nop5"
    redzone_guard: str = "auto"
    fork_guard: str | None = None  # passed on to the rewrite when set
    fail_on: str = "error"
    verify: bool = True
    keep_on_failure: bool = False

    def __post_init__(self) -> None:
        for name, value, allowed in (("mode", self.mode, MODES), ("form", self.form, FORMS),
                                     ("redzone_guard", self.redzone_guard, GUARDS),
                                     ("fail_on", self.fail_on, FAIL_LEVELS),
                                     ("fork_guard", self.fork_guard or "auto", FORK_GUARDS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")


@dataclass(slots=True)
class StepResult:
    path: str
    output: str
    changed: bool
    failed: bool
    findings: list[dict[str, str]]
    report: dict[str, Any]
    lines: list[str] = field(default_factory=list)  # what the step printed


def report_paths(report: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The JSON report and the HTML page beside it (same name, .html)."""
    p = Path(report)
    return p, p.with_suffix(".html")


def finding_line(path: str, f: dict[str, str]) -> str:
    """A finding as the one line a build log shows; an error (what fails a build) ends with
    its hint, what to do about it."""
    where = f" {f['where']}:" if f.get("where") else ""
    hint = f" (hint: {f['hint']})" if f.get("hint") and f["severity"] == "error" else ""
    return f"usdtpatch: {path}: {f['severity']} [{f['code']}]{where} {f['message']}{hint}"


def _reaches(findings: list[dict[str, str]], fail_on: str) -> bool:
    if fail_on == "never":
        return False
    limit = Severity(fail_on).rank
    return any(Severity(f["severity"]).rank >= limit for f in findings)


def _rewrite_findings(outcome: api.RewriteOutcome) -> list[dict[str, str]]:
    """The rewrite's findings, and each site it failed to rewrite as an error."""
    from usdtpatch.rewriter.plan import Status

    out = [f.to_json() for f in outcome.findings]
    for s in outcome.sites:
        if s.status is Status.FAILED:
            out.append({"code": s.code or "rewrite-failed", "severity": "error",
                        "where": s.probe.probe_id, "message": s.reason, "hint": ""})
    return out


def _summary(entry: dict[str, Any] | None, doc: dict[str, Any], opts: StepOptions) -> str:
    sites = doc["files"][0]["sites"]
    fast = sum(1 for s in sites if s["kernels"].get("6.18", {}).get("outcome") == "optimized")
    text = f"{len(sites)} site(s), {fast} optimized by a 6.18 kernel"
    if entry is not None:
        if entry.get("note"):
            text += "; already rewritten, left as it is"
        elif not entry["changed"]:
            text += "; nothing to rewrite"
        else:
            counts = ", ".join(f"{n} {a}" for a, n in sorted(entry["counts"].items()))
            text += f"; rewritten ({counts})"
        # the options a build fixes rather than taking the build machine's kernel
        # (docs/build-integration.md, "Defaults")
        text += f"; form {opts.form}, red-zone guard {opts.redzone_guard}"
    return text


def run_step(path: str, output: str | None = None, options: StepOptions | None = None,
             report: str | os.PathLike[str] | None = None, log: IO[str] | None = None
             ) -> StepResult:
    """Rewrite (or check) `path` into `output` (default: in place); see the module's doc.

    Raises UsdtpatchError when the input is unusable (then nothing is written or removed).
    """
    from usdtpatch import api
    from usdtpatch.report.checkjson import check_document

    opts = options if options is not None else StepOptions()
    target = path if output is None else output
    check_output(target, [path], in_place=output is None)
    entry: dict[str, Any] | None = None
    rewrite_findings: list[dict[str, str]] = []
    changed = False
    data: bytes | None = None  # the rewritten bytes, written once the check has passed
    origin = None
    if opts.mode == "rewrite":
        kw: dict[str, Any] = {} if opts.fork_guard is None else \
            {"fork_guard": opts.fork_guard}
        outcome, data, origin = api._rewritten(
            path, output, form=opts.form, redzone_guard=opts.redzone_guard,
            verify=opts.verify,
            in_place=output is None, **kw)
        entry = outcome.to_json()
        rewrite_findings = _rewrite_findings(outcome)
        entry["output"] = target
        changed = outcome.changed
    result = api._check_data(target, data) if changed and data is not None \
        else api.check(path)
    file_doc = result.to_json()
    file_doc["path"] = target
    doc = check_document([file_doc], [], opts.fail_on)
    findings = rewrite_findings + [f.to_json() for f in result.findings]
    failed = _reaches(findings, opts.fail_on)
    lines = [finding_line(target, f) for f in findings]
    lines.append(f"usdtpatch: {target}: {_summary(entry, doc, opts)}"
                 + (f"; FAILED: a finding reaches --fail-on {opts.fail_on}" if failed
                    else ""))
    result_doc: dict[str, Any] = {
        "schema": REPORT_SCHEMA, "schema_version": REPORT_SCHEMA_VERSION,
        "tool": {"name": "usdtpatch", "version": __version__},
        "input": path, "output": target, "mode": opts.mode,
        "options": {"form": opts.form, "redzone_guard": opts.redzone_guard,
                    "fork_guard": opts.fork_guard, "verify": opts.verify},
        "fail_on": opts.fail_on, "failed": failed, "changed": changed,
        "findings": findings, "rewrite": entry, "check": doc,
    }
    if report is not None:
        from usdtpatch.report.html import html_page

        jpath, hpath = report_paths(report)
        try:
            jpath.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{jpath}: cannot write the report: "
                              f"{exc.strerror or exc}") from exc
        write_atomic(jpath, (json.dumps(result_doc, indent=2) + "\n").encode())  # umask
        write_atomic(hpath, html_page(doc).encode())
        lines.append(f"usdtpatch: {target}: report {jpath} (and {hpath.name})")
    if failed:
        if output is None and not opts.keep_on_failure:
            with contextlib.suppress(OSError):
                os.unlink(path)
            lines.append(f"usdtpatch: {path}: removed, so that the next build runs this "
                         f"step again")
    elif data is not None and (changed or output is not None):
        write_atomic(target, data, origin=origin, in_place=output is None)
    elif output is not None:  # check only, to another file
        data, origin = read_source(path)
        write_atomic(target, data, origin=origin)
    if log is not None:
        for line in lines:
            print(line, file=log)
    return StepResult(path, target, changed, failed, findings, result_doc, lines)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "post-link", help="the build step: rewrite or check one linked file, write a report, "
                          "fail on findings")
    p.add_argument("file", metavar="FILE", help="the file the linker has just written")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write the result here (default: rewrite FILE in place)")
    p.add_argument("--check-only", action="store_true",
                   help="do not rewrite: only check FILE (and fail on findings)")
    p.add_argument("--form", choices=FORMS, default="nop5", help="site form (default nop5)")
    p.add_argument("--redzone-guard", choices=GUARDS, default="auto",
                   help="as for `rewrite` (default auto)")
    p.add_argument("--fork-guard", choices=FORK_GUARDS, default=None,
                   help="as for `rewrite` (default: rewrite's default)")
    p.add_argument("--report", metavar="JSON",
                   help="write the JSON report here and the HTML page beside it (.html)")
    p.add_argument("--fail-on", choices=FAIL_LEVELS, default="error",
                   help="fail (exit 1) when a finding has this severity or worse "
                        "(default: error)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the emulator's equivalence check of each detour")
    p.add_argument("--keep-on-failure", action="store_true",
                   help="keep FILE when the step fails in place (default: remove it, so the "
                        "next build retries)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    opts = StepOptions(mode="check" if args.check_only else "rewrite", form=args.form,
                       redzone_guard=args.redzone_guard, fork_guard=args.fork_guard,
                       fail_on=args.fail_on,
                       verify=not args.no_verify, keep_on_failure=args.keep_on_failure)
    if args.output is not None and Path(args.output).resolve() == Path(args.file).resolve():
        print(f"usdtpatch: post-link: output {args.output} is the input; leave out -o to "
              f"rewrite in place", file=err)
        return 2
    try:
        res = run_step(args.file, args.output, opts, args.report, log=None)
    except UsdtpatchError as exc:
        error_line(args.file, exc, err)
        return 2
    for line in res.lines:
        print(line, file=err if res.failed else out)
    return 1 if res.failed else 0
