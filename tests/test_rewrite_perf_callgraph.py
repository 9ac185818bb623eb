"""perf record --call-graph dwarf through a detour (issue 33, item 4; docs/rewrite.md, "What
each consumer needs").

perf unwinds each sample's copied stack with libdw (or libunwind): it reads `.eh_frame`
and `.debug_frame`. The program (tests/data/unwind/btc.c, argument 4) spends its time in a
loop whose probe's window holds the call: samples fall in the callee (returning into the
detour) and in the detour. Before, a stripped rewritten program's chains stopped at the
detour (its FDEs were in a `.debug_frame` strip removed): a sample's chain reached main in
the original and not in the rewrite. Now as many samples of the program's own code reach
`__libc_start_call_main` as in the original, stripped or not, and where symbols are kept a
detour's samples are attributed to `framed.usdtpatch.0` (the function's split-off part).
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
def progs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    reason = _perf_reason()
    if reason is not None:
        pytest.skip(reason)
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    d = tmp_path_factory.mktemp("perfcg")
    exe, rw = d / "btc", d / "btc.rw"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(SRC)], check=True, timeout=120)
    assert run_cli("rewrite", exe, "-o", rw, "--calls", "move").rc == 0
    out = {("as-is", "orig"): exe, ("as-is", "rw"): rw}
    for kind, f in (("orig", exe), ("rw", rw)):
        dst = d / f"{f.name}.s"
        subprocess.run(["strip", str(f), "-o", str(dst)], check=True, timeout=60)
        out[("strip", kind)] = dst
    return out


def _chains(prog: Path, tmp: Path) -> list[list[tuple[str, str]]]:
    """Each sample's call chain of the program's own code: [(symbol, dso)] innermost first."""
    env = dict(os.environ, HOME=str(tmp))  # perf's build-id cache: its own
    tmp.mkdir(exist_ok=True)
    data = tmp / "perf.data"
    rec = subprocess.run(["perf", "record", "-q", "-o", str(data), "--call-graph", "dwarf",
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
def test_dwarf_call_chains_through_a_detour_are_complete(
        how: str, progs: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    want = _complete(_chains(progs[(how, "orig")], tmp_path / "orig"))
    got_chains = _chains(progs[(how, "rw")], tmp_path / "rw")
    got = _complete(got_chains)
    assert want > 0.9, want
    assert got >= want - 0.05, (how, want, got)
    if how == "as-is":
        leaves = {c[0][0] for c in got_chains}
        assert "framed.usdtpatch.0" in leaves, leaves  # a detour's samples: framed's part
