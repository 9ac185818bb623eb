"""`usdtpatch dtrace -h|-G -s FILE.d [-o OUT] [-C] [-I DIR] [-D NAME[=V]] [--no-semaphores]`.

A replacement for systemtap's dtrace script with the same command line (projects call it as
`$(DTRACE) -h -s probes.d -o probes.h` and `$(DTRACE) -G -s probes.d -o probes.o`): -h writes
the probe header, -G compiles the semaphore object with $CC (default gcc) and $CFLAGS. -C runs
$CPP (default cpp) over the .d file first, with the -I and -D options. Options systemtap
ignores are ignored here too (-64, -32, -fpic, -fPIC, -x ARG, --types, --no-pyparsing), as are
object files after the options (systemtap's -G does not read them either).

Without -o the output is the .d file's base name with .h or .o, in the current directory.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Any

from usdtpatch import api
from usdtpatch.api import InputError, OutputError, check_output, write_atomic
from usdtpatch.cli.common import EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("dtrace", add_help=False,
                       help="systemtap-compatible dtrace -h / -G over usdtpatch's sys/sdt.h",
                       description="Generate a probe header (-h) or semaphore object (-G) "
                                   "from a DTrace provider file, as systemtap's dtrace does.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("-h", dest="header", action="store_true", help="write the probe header")
    mode.add_argument("-G", dest="stub", action="store_true",
                      help="compile the object that defines the semaphores")
    p.add_argument("-s", dest="script", metavar="FILE.d", help="the provider definitions")
    p.add_argument("-o", dest="output", metavar="OUT", help="the output file")
    p.add_argument("-C", dest="cpp", action="store_true", help="run cpp over FILE.d first")
    p.add_argument("-I", dest="includes", action="append", default=[], metavar="DIR",
                   help="include directory for -C (and -G's compiler)")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=V]",
                   help="macro definition for -C (and -G's compiler)")
    p.add_argument("-k", dest="keep", action="store_true",
                   help="keep the generated C source of -G (its path is printed)")
    p.add_argument("--no-semaphores", dest="semaphores", action="store_false",
                   help="probes without semaphores: NAME_ENABLED() is always 1")
    p.add_argument("--help", action="help", help="show this help and exit")
    for flag in ("-64", "-32", "-fpic", "-fPIC", "--types", "--no-pyparsing"):
        p.add_argument(flag, dest=f"ignored_{flag.strip('-')}", action="store_true",
                       help=argparse.SUPPRESS)
    p.add_argument("-x", dest="ignored_x", action="append", help=argparse.SUPPRESS)
    p.add_argument("objects", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def _default_output(script: str, suffix: str) -> str:
    return Path(script).stem + suffix


def _compile_stub(source: str, out: str, includes: list[str], defines: list[str],
                  keep: bool, err: IO[str]) -> None:
    cc = shlex.split(os.environ.get("CC", "gcc"))
    cflags = shlex.split(os.environ.get("CFLAGS", "").replace("\\\n", " "))
    with tempfile.TemporaryDirectory(prefix="usdtpatch-dtrace-") as tmp:
        src = Path(tmp) / (Path(out).stem + "-semaphores.c")
        obj = Path(tmp) / "stub.o"
        src.write_text(source)
        cmd = [*cc, *(f"-D{d}" for d in defines), *(f"-I{d}" for d in includes), *cflags,
               "-fPIC", "-c", str(src), "-o", str(obj)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise OutputError(f"{out}: cannot run {cc[0]}: {exc.strerror or exc}") from exc
        if keep:
            kept = Path(out).with_suffix(".semaphores.c")
            write_atomic(kept, source.encode())
            print(f"source: {kept}", file=err)
        if proc.returncode != 0:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln),
                         proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else "")
            raise OutputError(f"{out}: {cc[0]} failed on the semaphore source: {first}")
        write_atomic(out, obj.read_bytes())


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    if not args.header and not args.stub:
        raise InputError("dtrace: give -h (write the header) or -G (build the semaphore "
                         "object)")
    if not args.script:
        raise InputError("dtrace: -s FILE.d is required")
    target = args.output or _default_output(args.script, ".h" if args.header else ".o")
    check_output(target, [args.script], can_in_place=False)  # never the .d file, nor a device
    options: dict[str, Any] = {"cpp": args.cpp, "includes": args.includes,
                               "defines": args.defines, "semaphores": args.semaphores}
    if args.header:
        write_atomic(target, api.dtrace_header(args.script, **options).encode())
    else:
        _compile_stub(api.dtrace_semaphores(args.script, **options), target, args.includes,
                      args.defines, args.keep, err)
    return EXIT_OK
