"""`usdtpatch rewrite FILE... (-o OUT | --in-place | --dry-run) [--form F] [--redzone-guard G]
[--fork-guard G]` and `usdtpatch restore FILE (-o OUT | --in-place)`.

Parse, call usdtpatch.api, render. The input is never touched unless --in-place; an output
that is an input (by any spelling or link) or an existing non-regular file is refused before
anything is read. Output is written atomically with the input's permission bits. Each detour
is verified before the file is written, proved where the prover can and in the emulator
otherwise (--no-prove: the emulator only; --no-verify skips it and says so); a site that
fails stays as it was and the exit status is 1. --dry-run prints the decisions
without building a file. A file without USDT probes is one line, never written: with -o
an input error (exit 2: the output asked for does not exist), with --in-place or --dry-run
a line of the report (exit 0: the file as it is is the answer); --in-place writes no file that
does not change. `rewrite --tree DIR`: every ELF file with probes under DIR, in place
(rewrite_tree; usdtpatch.integrate.tree finds them).

Deferred imports: report/render.py (rich: the progress bar), report/text.py (the table,
not for --json), report/show.py (only for a --report page), integrate/tree.py (--tree).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from usdtpatch import api
from usdtpatch.api import (
    KERNEL_CHOICES,
    FileRewrite,
    ForkGuard,
    Form,
    Guard,
    InputError,
    OutputError,
    UsdtpatchError,
    check_output,
)
from usdtpatch.cli.common import EXIT_FAIL, EXIT_OK, EXIT_UNUSABLE, error_line, printable
from usdtpatch.integrate.tree import TREE_KERNEL
from usdtpatch.report.rewrite import (
    outcome_json,
    report_document,
    report_fields,
    report_kind,
    restore_line,
    result_json,
    rewrite_document,
    write_report,
)


def _jobs(text: str) -> int:
    """-j N: a number of processes, at least 1."""
    try:
        n = int(text, 10)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of processes >= 1")
    return n


def register(sub: Any) -> None:
    p = sub.add_parser("rewrite", help="turn 1-byte probe sites into 5-byte NOP sites")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="linked ELF files (executables, shared libraries), never changed "
                        "unless --in-place")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="OUT",
                       help="output file (one input) or existing directory (several)")
    where.add_argument("--in-place", action="store_true", help="replace each input")
    where.add_argument("--dry-run", action="store_true",
                       help="print the decisions, build and write nothing")
    p.add_argument("--tree", metavar="DIR",
                   help="every ELF file with probes under DIR (an install root: regular "
                        "files, symbolic links never followed, hard links once), in place; "
                        "one line per file and the counts; --form auto is for --kernel "
                        f"{TREE_KERNEL} unless --kernel names another")
    p.add_argument("--form", choices=["auto", *(f.value for f in Form)], default="auto",
                   help="site form: auto (the one the kernel optimizes, told by the uprobe "
                        "syscall's answer: nop5 on the nop5 generation, e.g. 6.18; combo10 "
                        "on the nop10 one, e.g. 7.3; none, file left as it is, on a kernel "
                        "without the uprobe syscall), nop5, combo5, combo10 (default auto)")
    p.add_argument("--kernel", choices=list(KERNEL_CHOICES), default=None,
                   help="with --form auto: the kernel generation the binary will run on, "
                        "instead of the running kernel's (nop5: 6.18.y; nop10: 7.3 and "
                        "backports such as Debian's 7.2.13; 6.18 and nop10-series are "
                        "the old names)")
    p.add_argument("--redzone-guard", choices=[g.value for g in Guard], default=Guard.AUTO.value,
                   help="wrap sites in lea -128/+128 of rsp: auto (where the red zone may be "
                        "in use), always, never (default auto)")
    p.add_argument("--fork-guard", choices=[g.value for g in ForkGuard],
                   default=ForkGuard.AUTO.value,
                   help="restore optimized sites in forked children: auto (where it can be "
                        "added), always (refuse a file it cannot cover), never (default auto)")
    p.add_argument("--calls", choices=["auto", "move", "emulate"], default="auto",
                   help="calls inside a patch window: auto (emulate them where the window "
                        "allows, so the callee sees its original return address; else move "
                        "them into the detour, with its own exception table where needed), "
                        "move, emulate (never in a file marked for shadow stacks) "
                        "(default auto)")
    p.add_argument("--keep-build-id", action="store_true",
                   help="keep the original's build-id (default: a new one derived from it, "
                        "so that perf's build-id cache and debuginfod do not take the "
                        "rewritten file for the original; the marker keeps the original's)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the equivalence check of each detour")
    p.add_argument("--no-prove", action="store_true",
                   help="check each detour in the emulator only (64 random states), not by "
                        "the proof first (each site's verification then says emulated)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--report", metavar="FILE",
                   help="also write a report of what was changed, skipped and why, with sizes "
                        "and time: FILE.html (a page), FILE.json or FILE.sarif")
    p.add_argument("-j", "--jobs", type=_jobs, default=1, metavar="N",
                   help="rewrite N files at once")
    p.set_defaults(func=run)

    r = sub.add_parser("restore", help="give back the original of a rewritten file")
    r.add_argument("file", metavar="FILE", help="a file written by `usdtpatch rewrite`")
    rwhere = r.add_mutually_exclusive_group(required=True)
    rwhere.add_argument("-o", "--output", metavar="OUT",
                        help="write the original here (its sha256 checked first)")
    rwhere.add_argument("--in-place", action="store_true",
                        help="replace FILE with its original")
    r.set_defaults(func=run_restore)


def _target(path: str, output: str | None, several: bool) -> str | None:
    """Where one input's output goes (None: nowhere, a dry run or in place)."""
    if output is None:
        return None
    out = Path(output)
    if several or out.is_dir():
        return str(out / Path(path).name)
    return str(out)


@dataclass
class _Results:
    """What the rewrites of the files gave, in input order: their entries of the rewrite
    document, the files refused, each file's report fields, whether a site failed."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    extras: list[dict[str, Any]] = field(default_factory=list)
    failed: bool = False
    unwritten: set[str] = field(default_factory=set)  # refused because the write failed

    def add(self, entry: dict[str, Any], failed: bool, seconds: float,
            size_before: int | None) -> None:
        self.entries.append(entry)
        self.extras.append(_report_extra(entry, seconds, size_before))
        self.failed = self.failed or failed

    def in_order(self, paths: list[str]) -> None:
        """The entries and errors in the order of `paths` (the inputs)."""
        rank = {p: i for i, p in reversed(list(enumerate(paths)))}
        both = sorted(zip(self.entries, self.extras, strict=True),
                      key=lambda e: rank.get(e[0]["path"], len(paths)))
        self.entries = [e for e, _ in both]
        self.extras = [x for _, x in both]
        self.errors.sort(key=lambda e: rank.get(e["path"], len(paths)))

    def refuse(self, path: str, exc: UsdtpatchError, err: IO[str]) -> None:
        self.errors.append({"path": path, "error": str(exc)})
        if isinstance(exc, OutputError):
            self.unwritten.add(path)
        error_line(path, exc, err)


def _refused(files: list[str], todo: list[tuple[str, str | None]], in_place: bool,
             report: str | None, err: IO[str]) -> bool:
    """Check every output (and the report) before any input is read: a line for each one
    refused; whether one was."""
    refused = False
    for p, t in todo:
        try:
            if t is not None:
                check_output(t, files)
            elif in_place:
                check_output(p, in_place=True)
        except UsdtpatchError as exc:
            print(printable(f"usdtpatch: rewrite: {exc}"), file=err)
            refused = True
    if report is not None:
        try:
            report_kind(report)
            check_output(report, files + [t for _, t in todo if t is not None],
                         can_in_place=False)
        except UsdtpatchError as exc:
            print(printable(f"usdtpatch: rewrite: {exc}"), file=err)
            refused = True
    return refused


def _rewrite_all(todo: list[tuple[str, str | None]], jobs: int, options: dict[str, Any],
                 res: _Results, err: IO[str]) -> None:
    """Rewrite the files (api.rewrite_files): in `jobs` worker processes, else here one after
    the other with a progress bar on a terminal."""
    if jobs > 1:
        _collect(api.rewrite_files(todo, jobs=jobs, **options), res, err)
        return
    from usdtpatch.report.render import make_console, site_progress

    with site_progress(make_console(err)) as progress_for:
        def watch(path: str) -> tuple[Any, Any]:
            shown = progress_for(Path(path).name)
            return shown.sites, shown.phase

        _collect(api.rewrite_files(todo, watch=watch, **options), res, err)


def _collect(answers: Iterable[FileRewrite], res: _Results, err: IO[str]) -> None:
    for a in answers:
        if a.outcome is None:
            assert a.error is not None
            res.refuse(a.path, a.error, err)
        else:
            res.add(outcome_json(a.outcome), a.outcome.failed, a.seconds, a.size_before)


def rewrite_files(files: list[str], out: IO[str], err: IO[str], *, output: str | None,
                  in_place: bool = False, form: str = "auto", kernel: str | None = None,
                  guard: str = Guard.AUTO.value, fork_guard: str = ForkGuard.AUTO.value,
                  verify: bool = True, as_json: bool = False, jobs: int = 1,
                  report: str | None = None, calls: str = "auto", prove: bool = True,
                  keep_build_id: bool = False) -> int:
    """Rewrite `files` to `output` (a file, or a directory for several), in place, or (both
    unset) as a dry run; print the report (and write it to `report`: .html, .json, .sarif);
    the exit status."""
    several = len(files) > 1
    if several and output and not Path(output).is_dir():
        print(f"usdtpatch: rewrite: with several inputs, -o must name an existing directory "
              f"({output} is not one)", file=err)
        return EXIT_UNUSABLE
    todo = [(p, _target(p, output, several)) for p in files]
    if _refused(files, todo, in_place, report, err):
        return EXIT_UNUSABLE
    views: dict[str, list[dict[str, Any]]] = {}  # per input: `show` of each site, for .html
    if report is not None and report_kind(report) == ".html":
        for p, _ in todo:  # of the inputs as they are, before any is rewritten in place
            with contextlib.suppress(UsdtpatchError):  # the rewrite below reports the file
                views[p] = _site_views(p)
    options = {"form": form, "redzone_guard": guard, "fork_guard": fork_guard,
               "verify": verify, "in_place": in_place, "calls": calls, "kernel": kernel,
               "prove": prove, "keep_build_id": keep_build_id}
    res = _Results()
    started = time.monotonic()
    bare = [(p, t) for p, t in todo if _no_probes(p)]
    for p, t in bare:  # nothing to rewrite: one line, nothing written (docs/rewrite.md)
        if t is not None:  # the output asked for will not exist: an input error, exit 2
            res.refuse(p, InputError(f"{p}: {NO_PROBES}; {t} not written"), err)
        else:
            res.entries.append(result_json(p, None, form, guard, verify, False, (), (),
                                           note=NO_PROBES))
            res.extras.append(_report_extra(res.entries[-1], 0.0, None))
    rest = [x for x in todo if x not in bare]
    _rewrite_all(rest, jobs if several else 1, options, res, err)
    if bare:
        res.in_order([p for p, _ in todo])
    doc = rewrite_document(res.entries, res.errors, time.monotonic() - started)
    if as_json:
        out.write(json.dumps(doc) + "\n")
    else:
        from usdtpatch.report.text import print_rewrite

        print_rewrite(out, doc)
    if report is not None:
        try:
            write_report(report, report_document(doc, res.extras),
                         [views.get(e["path"], []) for e in res.entries])
        except UsdtpatchError as exc:
            print(printable(f"usdtpatch: rewrite: {exc}"), file=err)
            return EXIT_UNUSABLE
    if res.errors:
        return EXIT_UNUSABLE
    return EXIT_FAIL if res.failed else EXIT_OK


NO_PROBES = "no USDT probes: nothing to rewrite, nothing written"


def _no_probes(path: str) -> bool:
    """Whether `path` is an ELF file without a USDT probe (read mapped, as `list` reads it;
    a file that cannot be read is left to api.rewrite, which says why)."""
    try:
        return not api.load(path, mapped=True).probes
    except UsdtpatchError:
        return False


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _site_views(path: str) -> list[dict[str, Any]]:
    """The `show` document of every site of `path` (the report's per-site view)."""
    from usdtpatch.report.show import site_views

    return site_views(path, api.check(path).report)


def _report_extra(entry: dict[str, Any], seconds: float, before: int | None = None
                  ) -> dict[str, Any]:
    """A file's report fields: its size before (measured before the rewrite), its output's
    size (None: nothing written), the time its rewrite took."""
    written = entry["output"]
    return report_fields(before, _size(written) if written else None, seconds)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    if args.tree is not None:
        if args.files or args.output is not None or args.report is not None:
            print("usdtpatch: rewrite: --tree rewrites the files of DIR in place: name no FILE, "
                  "no -o and no --report (--json prints the whole run's document)", file=err)
            return EXIT_UNUSABLE
        return rewrite_tree(args.tree, out, err, dry_run=args.dry_run, form=args.form,
                            kernel=args.kernel, guard=args.redzone_guard,
                            fork_guard=args.fork_guard, verify=not args.no_verify,
                            as_json=args.json, jobs=args.jobs, calls=args.calls,
                            prove=not args.no_prove, keep_build_id=args.keep_build_id)
    if not args.files or not (args.output or args.in_place or args.dry_run):
        print("usdtpatch: rewrite: name FILE... and one of -o, --in-place, --dry-run "
              "(or --tree DIR)", file=err)
        return EXIT_UNUSABLE
    return rewrite_files(args.files, out, err, output=args.output, in_place=args.in_place,
                         form=args.form, kernel=args.kernel, guard=args.redzone_guard,
                         fork_guard=args.fork_guard,
                         verify=not args.no_verify, as_json=args.json, jobs=args.jobs,
                         report=args.report, calls=args.calls, prove=not args.no_prove,
                         keep_build_id=args.keep_build_id)


def restore_file(path: str, output: str | None, out: IO[str], err: IO[str], *,
                 in_place: bool = False) -> int:
    """Restore `path` to `output` (or over itself); one line on `out`; the exit status."""
    try:
        res = api.restore(path, output, in_place=in_place)
    except UsdtpatchError as exc:
        error_line(path, exc, err)
        return EXIT_UNUSABLE
    print(restore_line(path, res), file=out)
    return EXIT_OK


def run_restore(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    return restore_file(args.file, args.output, out, err, in_place=args.in_place)


def rewrite_tree(root: str, out: IO[str], err: IO[str], *, dry_run: bool = False,
                 form: str = "auto", kernel: str | None = None,
                 guard: str = Guard.AUTO.value, fork_guard: str = ForkGuard.AUTO.value,
                 verify: bool = True, as_json: bool = False, jobs: int = 1,
                 calls: str = "auto", prove: bool = True, keep_build_id: bool = False) -> int:
    """`rewrite --tree DIR`: every ELF file with probes under `root`, in place (or a dry run),
    `jobs` at once; a line per file and the counts (usdtpatch.integrate.tree says what is
    looked at). Exit 2 for a tree that cannot be used (nothing rewritten) or a file that
    could not be written after all (left whole as it was), 1 when a site failed its
    verification, else 0: a file whose rewrite is refused is kept as it is, and its line says
    why."""
    from usdtpatch.integrate.tree import rewrite_linked, scan_tree, unwritable

    if form == "auto" and kernel is None:
        kernel = TREE_KERNEL  # a fixed form: never the build host's kernel
    started = time.monotonic()
    try:
        scan = scan_tree(root)
    except UsdtpatchError as exc:
        print(printable(f"usdtpatch: rewrite --tree: {exc}"), file=err)
        return EXIT_UNUSABLE
    if not dry_run:
        bad = unwritable(scan.todo)
        for line in bad:
            print(printable(f"usdtpatch: rewrite --tree: {line}"), file=err)
        if bad:
            return EXIT_UNUSABLE
    options: dict[str, Any] = {"form": form, "redzone_guard": guard, "fork_guard": fork_guard,
                               "verify": verify, "in_place": not dry_run, "calls": calls,
                               "kernel": kernel, "prove": prove,
                               "keep_build_id": keep_build_id}
    res = _Results()
    # a file with other names (in the tree or out of it) is rewritten once and renamed into
    # place at each of its names in the tree (rewrite_linked): --in-place refuses hard links
    single: list[tuple[str, str | None]] = [(f.path, None) for f in scan.todo
                                            if not f.links and not f.outside]
    _rewrite_all(single, jobs if len(single) > 1 else 1, options, res, err)
    linked_opts = {k: v for k, v in options.items() if k != "in_place"}
    for f in (f for f in scan.todo if f.links or f.outside):
        try:
            t0 = time.monotonic()
            o = api.rewrite(f.path, None, **linked_opts) if dry_run \
                else rewrite_linked(f, linked_opts)
        except UsdtpatchError as exc:
            res.refuse(f.path, exc, err)
            continue
        res.add(outcome_json(o), o.failed, time.monotonic() - t0, None)
    res.in_order([f.path for f in scan.todo])
    unwritten = [e for e in res.errors if e["path"] in res.unwritten]
    seconds = time.monotonic() - started
    doc = rewrite_document(res.entries, res.errors, seconds)
    counts = _tree_counts(scan, res)
    if as_json:
        out.write(json.dumps({**doc, "tree": {"root": root, **counts}}) + "\n")
    else:
        for line in _tree_lines(scan, res, dry_run):
            print(printable(line), file=out)
        what = f"form {form}" if form != "auto" else f"--form auto for --kernel {kernel}"
        print(f"usdtpatch: tree {printable(root)}: {counts['regular']} regular files, "
              f"{counts['elf']} ELF, {counts['with_probes']} with probes: "
              f"{counts['rewritten']} {'to rewrite' if dry_run else 'rewritten'}, "
              f"{counts['unchanged']} unchanged, {counts['refused']} refused (kept as they "
              f"are), {counts['rewritten_before']} rewritten before; {counts['no_probes']} "
              f"ELF without probes and {counts['unreadable']} unreadable left untouched "
              f"({what}, -j {jobs}, {seconds:.1f} s)", file=out)
    if unwritten:  # the file is whole as it was, but the tree is not what was asked
        return EXIT_UNUSABLE
    return EXIT_FAIL if res.failed else EXIT_OK


def _tree_counts(scan: Any, res: _Results) -> dict[str, int]:
    changed = sum(1 for e in res.entries if e["changed"])
    return {"regular": scan.regular, "elf": scan.elf,
            "with_probes": len(scan.todo) + len(scan.rewritten),
            "rewritten": changed, "unchanged": len(res.entries) - changed,
            "refused": len(res.errors), "rewritten_before": len(scan.rewritten),
            "no_probes": scan.no_probes, "unreadable": len(scan.unreadable)}


def _tree_lines(scan: Any, res: _Results, dry_run: bool) -> list[str]:
    """One line per file with probes (and per ELF file that could not be read), name order."""
    links = {f.path: f for f in scan.todo}
    lines: list[tuple[str, str]] = []
    for e in res.entries:
        sites = sum(e["counts"].values())
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(e["counts"].items()))
        verb = ("to rewrite" if dry_run else "rewritten") if e["changed"] else "unchanged"
        text = f"{e['path']}: {verb}, {sites} site(s) ({kinds}), form {e['form']}"
        f = links.get(e["path"])
        if f is not None and f.links:
            text += f"; also its hard links {', '.join(f.links)}"
        if f is not None and f.outside:
            text += f"; {f.outside} name(s) outside the tree keep the original"
        lines.append((e["path"], text))
    for er in res.errors:
        lines.append((er["path"], f"{er['path']}: refused, kept as it is: {er['error']}"))
    for p in scan.rewritten:
        lines.append((p, f"{p}: rewritten before (usdtpatch's marker), left as it is"))
    for p, why in scan.unreadable:
        lines.append((p, f"{p}: not read, left as it is: {why}"))
    return [f"  {text}" for _, text in sorted(lines)]
