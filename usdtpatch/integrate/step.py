"""The post-link step every build integration runs: `usdtpatch post-link FILE ...`.

One linked file is rewritten (or only checked), the rewritten bytes are checked, a report is
written into the build directory (JSON, and the HTML page beside it), every finding is printed
on one line, and the step fails (exit 1) when a finding reaches `--fail-on`.

The promises the build integrations rely on:

- deterministic: the same input and options give the same output bytes (no time stamps);
- idempotent: a file that carries usdtpatch's marker is left as it is (not even its mtime
  changes when it is rewritten in place), so a second build changes nothing;
- never half-done: the output is written atomically, and only once the check passed. When a
  rewrite in place fails, the file it was to rewrite is removed (as make's .DELETE_ON_ERROR
  does): otherwise the next build would take the linker's output as up to date and pass.
- a check never deletes or changes its input: `mode="check"` reads the file and writes only
  the report (and, with `output`, the copy), pass or fail.

Deferred imports: report/ (build.py, checkjson.py, rewrite.py, html.py), only when a step
runs (the setuptools command imports this module at every build). What the step reads and
writes goes through the public API only (rewrite_bytes, check_bytes, copy and the output
writes it re-exports).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from usdtpatch import api
from usdtpatch.api import OutputError, check_output, write_atomic

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


def removes_on_failure(options: StepOptions, output: str | None) -> bool:
    """Whether a failed step removes its input: only a rewrite in place, which the build would
    otherwise take as done, and never a check (which reads its input and leaves it alone)."""
    return options.mode == "rewrite" and output is None and not options.keep_on_failure


def run_step(path: str, output: str | None = None, options: StepOptions | None = None,
             report: str | os.PathLike[str] | None = None, log: IO[str] | None = None
             ) -> StepResult:
    """Rewrite (or check) `path` into `output` (default: in place); see the module's doc.

    Raises UsdtpatchError when the input is unusable (then nothing is written or removed).
    """
    from usdtpatch.report.build import build_report, finding_line, rewrite_findings, summary_text
    from usdtpatch.report.checkjson import check_document, reaches, result_json
    from usdtpatch.report.rewrite import outcome_json

    opts = options if options is not None else StepOptions()
    target = path if output is None else output
    check_output(target, [path], in_place=output is None)
    entry: dict[str, Any] | None = None
    from_rewrite: list[dict[str, str]] = []
    changed = False
    rewritten: api.Rewritten | None = None  # its bytes written once the check has passed
    if opts.mode == "rewrite":
        kw: dict[str, Any] = {} if opts.fork_guard is None else \
            {"fork_guard": opts.fork_guard}
        rewritten = api.rewrite_bytes(
            path, output, form=opts.form, redzone_guard=opts.redzone_guard,
            verify=opts.verify,
            in_place=output is None, **kw)
        outcome = rewritten.outcome
        entry = outcome_json(outcome, output=target)
        from_rewrite = rewrite_findings(outcome)
        changed = outcome.changed
    data = rewritten.data if rewritten is not None else None
    result = api.check_bytes(target, data) if changed and data is not None \
        else api.check(path)
    doc = check_document([result_json(result, path=target)], [], opts.fail_on)
    findings = from_rewrite + [f.to_json() for f in result.findings]
    failed = reaches(findings, opts.fail_on)
    lines = [finding_line(target, f) for f in findings]
    lines.append(f"usdtpatch: {target}: {summary_text(entry, doc, opts.form, opts.redzone_guard)}"
                 + (f"; FAILED: a finding reaches --fail-on {opts.fail_on}" if failed
                    else ""))
    result_doc = build_report(
        path=path, output=target, mode=opts.mode,
        options={"form": opts.form, "redzone_guard": opts.redzone_guard,
                 "fork_guard": opts.fork_guard, "verify": opts.verify},
        fail_on=opts.fail_on, failed=failed, changed=changed, findings=findings, rewrite=entry,
        check=doc)
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
        if removes_on_failure(opts, output):
            with contextlib.suppress(OSError):
                os.unlink(path)
            lines.append(f"usdtpatch: {path}: removed, so that the next build runs this "
                         f"step again")
    elif rewritten is not None and data is not None and (changed or output is not None):
        rewritten.write()
    elif output is not None:  # check only, to another file
        api.copy(path, target)
    if log is not None:
        for line in lines:
            print(line, file=log)
    return StepResult(path=path, output=target, changed=changed, failed=failed, findings=findings,
                      report=result_doc, lines=lines)
