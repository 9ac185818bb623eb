"""`usdtpatch rewrite FILE... (-o OUT | --in-place | --dry-run) [--form F] [--redzone-guard G]`
and `usdtpatch restore FILE (-o OUT | --in-place)`.

The input is never touched unless --in-place. Output is written atomically (temp file +
rename) with the input's permission bits. Each detour is verified in the emulator before the
file is written (--no-verify skips it and says so); a site that fails stays as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import IO, Any

from usdtpatch.cli.common import EXIT_FAIL, EXIT_OK, EXIT_UNUSABLE, error_line
from usdtpatch.elf.image import parse_elf
from usdtpatch.errors import UsdtpatchError
from usdtpatch.io import read_input, write_atomic
from usdtpatch.rewrite.apply import (
    AlreadyRewritten,
    Verifier,
    restore_image,
    rewrite_image,
)
from usdtpatch.rewrite.forms import Form, Guard
from usdtpatch.rewrite.report import result_json, rewrite_document


def register(sub: Any) -> None:
    p = sub.add_parser("rewrite", help="turn 1-byte probe sites into 5-byte NOP sites")
    p.add_argument("files", nargs="+", metavar="FILE")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-o", "--output", metavar="OUT",
                       help="output file (one input) or existing directory (several)")
    where.add_argument("--in-place", action="store_true", help="replace each input")
    where.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    p.add_argument("--form", choices=[f.value for f in Form], default=Form.NOP5.value,
                   help="site form (default nop5)")
    p.add_argument("--redzone-guard", choices=[g.value for g in Guard], default=Guard.AUTO.value,
                   help="wrap sites in lea -128/+128 of rsp: auto (where the red zone may be "
                        "in use), always, never (default auto)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the emulator's equivalence check of each detour")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="rewrite N files at once")
    p.set_defaults(func=run)

    r = sub.add_parser("restore", help="give back the original of a rewritten file")
    r.add_argument("file", metavar="FILE")
    rwhere = r.add_mutually_exclusive_group(required=True)
    rwhere.add_argument("-o", "--output", metavar="OUT")
    rwhere.add_argument("--in-place", action="store_true")
    r.set_defaults(func=run_restore)


def _verifier(enabled: bool) -> Verifier | None:
    if not enabled:
        return None
    from usdtpatch.emulate.equivalence import verify_detour

    return verify_detour


def _target(path: str, args: argparse.Namespace, several: bool) -> str | None:
    if args.dry_run:
        return None
    if args.in_place:
        return path
    out = Path(args.output)
    if several or out.is_dir():
        return str(out / Path(path).name)
    return str(out)


def rewrite_one(path: str, target: str | None, form: str, guard: str,
                verify: bool, progress: Callable[[int, int], None] | None = None
                ) -> dict[str, Any]:
    """Rewrite one file (also run in worker processes); returns its report entry."""
    data = read_input(path)
    image = parse_elf(data)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    try:
        res = rewrite_image(image, Form(form), Guard(guard), _verifier(verify),
                            progress=progress)
    except AlreadyRewritten as exc:
        if target is not None and target != path:
            write_atomic(target, data, mode)
        return {"path": path, "output": target, "changed": False, "note": str(exc),
                "sites": [], "counts": {}, "findings": [], "form": form, "guard": guard,
                "verified": verify}
    if target is not None:
        write_atomic(target, res.data if res.data is not None else data, mode)
    return result_json(path, target, res, verify)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    several = len(args.files) > 1
    if several and args.output and not Path(args.output).is_dir():
        print(f"usdtpatch: rewrite: with several inputs, -o must name an existing directory "
              f"({args.output} is not one)", file=err)
        return EXIT_UNUSABLE
    jobs = [(p, _target(p, args, several)) for p in args.files]
    for p, t in jobs:
        if t is not None and t != p and Path(t).resolve() == Path(p).resolve():
            print(f"usdtpatch: rewrite: output {t} is the input; use --in-place", file=err)
            return EXIT_UNUSABLE
    files: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    verify = not args.no_verify
    started = time.monotonic()
    if args.jobs > 1 and several:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [(p, pool.submit(rewrite_one, p, t, args.form, args.redzone_guard,
                                       verify)) for p, t in jobs]
            for p, fut in futures:
                try:
                    files.append(fut.result())
                except UsdtpatchError as exc:
                    errors.append({"path": p, "error": str(exc)})
                    error_line(p, exc, err)
    else:
        from usdtpatch.report.render import make_console, site_progress

        console = make_console(err)
        with site_progress(console) as progress_for:
            for p, t in jobs:
                try:
                    files.append(rewrite_one(p, t, args.form, args.redzone_guard, verify,
                                             progress_for(Path(p).name)))
                except UsdtpatchError as exc:
                    errors.append({"path": p, "error": str(exc)})
                    error_line(p, exc, err)
    doc = rewrite_document(files, errors)
    doc["seconds"] = round(time.monotonic() - started, 3)
    if args.json:
        out.write(json.dumps(doc) + "\n")
    else:
        from usdtpatch.report.render import make_console, render_rewrite

        render_rewrite(make_console(out), doc)
    if errors:
        return EXIT_UNUSABLE
    failed = any(s["code"] in ("verification-failed", "relocation-failed")
                 for f in files for s in f["sites"])
    return EXIT_FAIL if failed else EXIT_OK


def run_restore(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    path = args.file
    data = read_input(path)
    original = restore_image(parse_elf(data))
    target = path if args.in_place else args.output
    write_atomic(target, original, stat.S_IMODE(os.stat(path).st_mode))
    print(f"{path}: restored to {target} ({len(original)} bytes, sha256 checked)", file=out)
    return EXIT_OK
