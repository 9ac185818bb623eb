"""`usdtpatch list FILE... [--json] [--provider P] [--probe NAME]`."""

from __future__ import annotations

import argparse
import json
from typing import IO, Any

from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE, error_line, function_names, load
from usdtpatch.errors import UsdtpatchError
from usdtpatch.report.listing import file_json, list_document
from usdtpatch.sites.probes import ProbeSet


def register(sub: Any) -> None:
    p = sub.add_parser("list", help="list every USDT probe of ELF files")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true", help="print a versioned JSON document")
    p.add_argument("--provider", metavar="P", help="only probes of provider P")
    p.add_argument("--probe", metavar="NAME", help="only probes called NAME")
    p.set_defaults(func=run)


def list_files(files: list[str], out: IO[str], err: IO[str], *, as_json: bool = False,
               provider: str | None = None, probe: str | None = None) -> int:
    """Print the probes of `files` (a table, or the JSON document); the exit status."""
    loaded: list[tuple[str, ProbeSet]] = []
    errors: list[dict[str, str]] = []
    for path in files:
        try:
            loaded.append((path, load(path)))
        except UsdtpatchError as exc:
            errors.append({"path": path, "error": str(exc)})
            error_line(path, exc, err)
    names = function_names([ps for _, ps in loaded])
    doc = list_document([file_json(p, ps, names, provider, probe) for p, ps in loaded], errors)
    if as_json:
        out.write(json.dumps(doc) + "\n")  # one write: the C encoder, not per-token writes
    else:
        from usdtpatch.report.plain import print_list

        print_list(out, doc)
    return EXIT_UNUSABLE if errors else EXIT_OK


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    return list_files(args.files, out, err, as_json=args.json, provider=args.provider,
                      probe=args.probe)
