"""perf record --call-graph dwarf and fp through a detour (issue 33, item 4; docs/rewrite.md,
"What each consumer needs").

perf unwinds each sample's copied stack with libdw (or libunwind), which reads
`.eh_frame_hdr`, `.eh_frame` and `.debug_frame`; with fp it follows rbp. The program
(tests/data/unwind/btc.c, argument 4) spends its time in a loop whose probe's window holds
the call: samples fall in the callee (returning into the detour) and in the detour. As many
samples of the program's own code reach `__libc_start_call_main` as in the original,
stripped or not, and where symbols are kept a detour's samples are attributed to
`framed.usdtpatch.0` or `loads.usdtpatch.0` (the function's split-off part). Measured:
this held before this change too (perf found the detours' FDEs through `.eh_frame_hdr`'s
table): it guards the layout that moved `.debug_frame` into the segment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.needs_cc, pytest.mark.slow]

SRC = ROOT / "tests" / "data" / "unwind" / "btc.c"


def _perf_reason() -> str | None:
    if shutil.which("perf") is None:
        return "needs perf"
    try:
        level = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    except (OSError, ValueError):
        return "perf_event_paranoid is not readable"
    if level > 1 and os.geteuid() != 0:
        return f"perf_event_paranoid is {level} and this is not root"
    return None


@pytest.fixture(scope="module")
def progs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], Path]:
    reason = _perf_reason()
    if reason is not None:
        pytest.skip(reason)
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    d = tmp_path_factory.mktemp("perfcg")
    out = {}
    for cg, flags in (("dwarf", []), ("fp", ["-fno-omit-frame-pointer"])):
        exe, rw = d / f"btc-{cg}", d / f"btc-{cg}.rw"
        subprocess.run(["gcc", "-O2", *flags, "-o", str(exe), str(SRC)], check=True,
                       timeout=120)
        assert run_cli("rewrite", exe, "-o", rw, "--calls", "move").rc == 0
        out[(cg, "as-is", "orig")], out[(cg, "as-is", "rw")] = exe, rw
        for kind, f in (("orig", exe), ("rw", rw)):
            dst = d / f"{f.name}.s"
            subprocess.run(["strip", str(f), "-o", str(dst)], check=True, timeout=60)
            out[(cg, "strip", kind)] = dst
    return out


def _chains(prog: Path, tmp: Path, cg: str) -> list[list[tuple[str, str]]]:
    """Each sample's call chain of the program's own code: [(symbol, dso)] innermost first."""
    env = dict(os.environ, HOME=str(tmp))  # perf's build-id cache: its own
    tmp.mkdir(exist_ok=True)
    data = tmp / "perf.data"
    rec = subprocess.run(["perf", "record", "-q", "-o", str(data), "--call-graph", cg,
                          str(prog), "4"], capture_output=True, text=True, env=env,
                         timeout=120, check=False)
    assert rec.returncode == 0, rec.stderr
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    assert script.returncode == 0, script.stderr
    chains: list[list[tuple[str, str]]] = []
    cur: list[tuple[str, str]] = []
    for ln in [*script.stdout.splitlines(), ""]:
        if not ln.strip():
            if cur and cur[0][1] == prog.name:
                chains.append(cur)
            cur = []
            continue
        parts = ln.split(None, 1)
        rest = parts[1] if len(parts) > 1 else ""
        sym, _, dso = rest.rpartition(" (")
        cur.append((sym.strip() or "[unknown]", Path(dso.rstrip(")")).name))
    assert len(chains) > 50, script.stdout[-2000:]
    return chains


def _complete(chains: list[list[tuple[str, str]]]) -> float:
    return sum(any(s == "__libc_start_call_main" for s, _d in c) for c in chains) / len(chains)


@pytest.mark.parametrize("how", ["as-is", "strip"])
@pytest.mark.parametrize("cg", ["dwarf", "fp"])
def test_call_chains_through_a_detour_are_complete(
        cg: str, how: str, progs: dict[tuple[str, str, str], Path], tmp_path: Path) -> None:
    """--call-graph dwarf, and fp on the program built with frame pointers."""
    want = _complete(_chains(progs[(cg, how, "orig")], tmp_path / "orig", cg))
    got_chains = _chains(progs[(cg, how, "rw")], tmp_path / "rw", cg)
    got = _complete(got_chains)
    assert want > 0.9, want
    assert got >= want - 0.05, (how, want, got)
    if how == "as-is":
        leaves = {c[0][0] for c in got_chains}
        # a detour's samples: its function's split-off part (framed's or loads')
        assert leaves & {"framed.usdtpatch.0", "loads.usdtpatch.0"}, leaves
