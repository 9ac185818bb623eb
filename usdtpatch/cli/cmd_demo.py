"""`usdtpatch demo [FILE] [--out DIR]`: the toolkit's main job on a bundled fixture.

1. list its probes; 2. check every site; 3. rewrite the 1-byte sites into nop5 sites (each
detour verified in the emulator); 4. plan the kernel's writes on the rewritten file and verify
them, torn states included, in the emulator; 5. restore the original byte for byte.
Each capability adds its step here, so that `make demo` always shows the whole toolkit.

Deferred imports: the other commands' modules (cli/cmd_check.py, cli/cmd_rewrite.py,
cli/cmd_verify.py) and report/render.py (rich), only when the demo runs.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from usdtpatch.cli import cmd_list
from usdtpatch.cli.common import EXIT_FAIL, EXIT_OK, EXIT_UNUSABLE
from usdtpatch.report.text import print_text

DEMO_FIXTURE = "fixtures/bin/demo"  # in the source tree; shipped as usdtpatch/data/demo
_SHIPPED = Path(__file__).resolve().parents[1] / "data" / "demo"


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="show the toolkit at work on a bundled fixture")
    p.add_argument("file", nargs="?", metavar="FILE",
                   help=f"the file to work on (default: the bundled demo program, "
                        f"{DEMO_FIXTURE} of the source tree, shipped in the package)")
    p.add_argument("--out", metavar="DIR",
                   help="where to leave the rewritten copy (default: a temporary folder)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    target = args.file or (str(_SHIPPED) if _SHIPPED.is_file() else None)
    if target is None:
        print(f"usdtpatch: demo: no FILE given and the bundled demo program {_SHIPPED} is "
              f"missing (a damaged installation)", file=err)
        return EXIT_UNUSABLE
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return _steps(target, Path(args.out), out, err, kept=True)
    with tempfile.TemporaryDirectory(prefix="usdtpatch-demo-") as tmp:
        return _steps(target, Path(tmp), out, err, kept=False)


def _steps(target: str, folder: Path, out: IO[str], err: IO[str], *, kept: bool) -> int:
    from usdtpatch.cli import cmd_check, cmd_rewrite, cmd_verify
    from usdtpatch.report.render import make_console

    console = make_console(out)
    rewritten = folder / (Path(target).name + ".rewritten")
    restored = folder / (Path(target).name + ".restored")
    results: list[tuple[str, int]] = []

    def step(title: str, action: Callable[[], int]) -> None:
        console.rule(title)
        results.append((title, action()))

    def verify() -> int:
        rc, text = cmd_verify.summarize(str(rewritten))
        print_text(out, text)
        return rc

    def restore() -> int:
        rc = cmd_rewrite.restore_file(str(rewritten), str(restored), out, err)
        same = hashlib.sha256(Path(target).read_bytes()).hexdigest() == \
            hashlib.sha256(restored.read_bytes()).hexdigest()
        console.print(f"restored copy {'equals' if same else 'DIFFERS FROM'} the original, "
                      f"byte for byte")
        return rc if same else EXIT_FAIL

    step(f"1. list: the probes of {target}",
         lambda: cmd_list.list_files([target], out, err))
    step("2. check: can the kernel optimize each site, and what would it take",
         lambda: cmd_check.check_and_render(target, out, err, fail_on="never"))
    step(f"3. rewrite: 1-byte sites become 5-byte NOP sites -> {rewritten}",
         lambda: cmd_rewrite.rewrite_files([target], out, err, output=str(rewritten)))
    step("4. plan + verify: the kernel's writes on the rewritten sites, torn states included",
         verify)
    step("5. restore: the original back from the rewritten file", restore)
    failed = [title.split(":")[0] for title, rc in results if rc != EXIT_OK]
    console.rule("demo done: every step passed" if not failed else
                 f"demo: steps {', '.join(failed)} failed")
    if not failed and kept:
        console.print(f"run both: {target}  and  {rewritten}  (they print the same)")
    if not kept:  # the files named above go with the temporary folder
        console.print(f"{folder} was a temporary folder: it is removed now, with the files "
                      f"named above in it; `usdtpatch demo --out DIR` keeps them")
    return EXIT_OK if not failed else EXIT_FAIL
