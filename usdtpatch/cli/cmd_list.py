"""`usdtpatch list FILE... [--json] [--provider P] [--probe [PROVIDER:]NAME]`.

Filtered, the heading of each file counts the probes shown and the file's total; patterns
that select no probe of any file are an error (exit 2, a line per file naming them and the
probes there are), as --probe is in every command.

Deferred imports: report/text.py, only for the table (not for --json).
"""

from __future__ import annotations

import argparse
import json

from usdtpatch import api
from usdtpatch.api import (
    NOT_FOUND,
    Probe,
    UsdtpatchError,
    demangle,
    demangle_unavailable,
    no_match,
)
from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE, error_line, printable
from usdtpatch.report.listing import (
    PROBE_PATTERN_HELP,
    file_json,
    list_document,
    relabel,
    selected,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`list` does not)
if TYPE_CHECKING:
    from typing import IO, Any


def register(sub: Any) -> None:
    p = sub.add_parser("list", help="list every USDT probe of ELF files")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="ELF executables, shared libraries, objects or core files")
    p.add_argument("--json", action="store_true", help="print a versioned JSON document")
    p.add_argument("--provider", metavar="P",
                   help="only probes of provider P (a shell pattern)")
    p.add_argument("--probe", metavar="PATTERN", help=f"only these probes: {PROBE_PATTERN_HELP}")
    p.set_defaults(func=run)


def list_files(files: list[str], out: IO[str], err: IO[str], *, as_json: bool = False,
               provider: str | None = None, probe: str | None = None) -> int:
    """Print the probes of `files` (a table, or the JSON document); the exit status.

    Each file is read and released before the next (mapped: api.load's `mapped`; a listing of
    thousands of files keeps none of them open); the function names of all of them are
    demangled in one batch at the end."""
    docs: list[dict[str, Any]] = []
    shown: list[list[Probe]] = []
    errors: list[dict[str, str]] = []
    ids: dict[str, list[str]] = {}  # the probes of each file, for a pattern that selects none
    for path in files:
        try:
            ps = api.load(path, mapped=True)
        except UsdtpatchError as exc:
            errors.append({"path": path, "error": exc.detail(path)})
            error_line(path, exc, err)
            continue
        docs.append(file_json(path, ps, {}, provider, probe))
        shown.append(selected(ps, provider, probe))
        ids[path] = [p.probe_id for p in ps.probes]
        del ps  # the last reference to the file's mapping
    if (provider is not None or probe is not None) and docs and not any(shown):
        for d in docs:  # the patterns selected nothing in any file: as in every command
            pattern = " ".join([f"--provider {provider}"] * (provider is not None)
                               + [f"--probe {probe}"] * (probe is not None))
            if probe is None:  # the providers there are, for a provider that is not one
                line = no_match(d["path"], [pattern],
                                (i.split(":", 1)[0] for i in ids[d["path"]]), kind="provider")
            else:
                line = no_match(d["path"], [pattern], ids[d["path"]])
            print(printable(f"usdtpatch: {line}"), file=err)
        return EXIT_UNUSABLE
    functions = [p.function for probes in shown for p in probes if p.function]
    names = demangle(functions)
    if demangle_unavailable(functions):
        print(f"usdtpatch: note: {NOT_FOUND}", file=err)
    for doc, probes in zip(docs, shown, strict=True):
        relabel(doc, probes, names)
    doc = list_document(docs, errors)
    if as_json:
        out.write(json.dumps(doc) + "\n")  # one write: the C encoder, not per-token writes
    else:
        from usdtpatch.report.text import print_list

        print_list(out, doc)
    return EXIT_UNUSABLE if errors else EXIT_OK


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    return list_files(args.files, out, err, as_json=args.json, provider=args.provider,
                      probe=args.probe)
