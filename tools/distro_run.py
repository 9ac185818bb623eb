"""The distribution-scale run (docs/outcomes.md, "Whole Debian packages through --tree"):
`python -m tools.distro_run WORK PACKAGE... [-j N] [--markdown]`.

Each PACKAGE is fetched with `apt-get download` at the installed version when the archive still
has it (else the archive's candidate, as the Makefile's test-data does; a package that
`make test-data` unpacked into build/cache/PACKAGE/root is copied from there), unpacked with
`dpkg -x` into WORK/PACKAGE (a staged tree: nothing installed, no system
file touched), and rewritten with `usdtpatch rewrite --tree WORK/PACKAGE -j N --json`, timed
(wall clock, the whole command). A second run over the same tree is timed too and must change
nothing (every file's sha256 and mtime compared). One row per package: its version, its
regular and ELF files, the files with probes, the files rewritten, the sites converted of the
sites, the files refused (kept as they are), the time of each run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "cache"
CONVERTED = ("in-place", "detour", "moved")


def _query(package: str) -> str | None:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", package],
                          capture_output=True, text=True, check=False)
    words = proc.stdout.split()
    return words[-1] if proc.returncode == 0 and "installed" in words[:3] else None


def _candidate(package: str) -> str | None:
    out = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True,
                         check=False).stdout
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            v = line.split(":", 1)[1].strip()
            return None if v in ("", "(none)") else v
    return None


def _archive(package: str) -> set[str]:
    """The versions the archive has (apt-cache madison)."""
    out = subprocess.run(["apt-cache", "madison", package], capture_output=True, text=True,
                         check=False).stdout
    return {line.split("|")[1].strip() for line in out.splitlines() if line.count("|") >= 2}


def stage(package: str, work: Path) -> tuple[Path, str]:
    """WORK/PACKAGE: the package's files (dpkg -x), and its version."""
    tree = work / package
    if tree.exists():
        shutil.rmtree(tree)
    cached = CACHE / package
    if (cached / "root").is_dir() and (cached / "version").is_file():
        shutil.copytree(cached / "root", tree, symlinks=True)
        return tree, (cached / "version").read_text().strip()
    installed = _query(package)
    version = installed if installed in _archive(package) else _candidate(package)
    if version is None:
        raise SystemExit(f"distro_run: {package}: neither installed nor in the archive")
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    for old in debs.glob(f"{package}_*.deb"):
        old.unlink()
    subprocess.run(["apt-get", "download", "-qq", "-o", "APT::Sandbox::User=root",
                    f"{package}={version}"], cwd=debs, check=True)
    (deb,) = debs.glob(f"{package}_*.deb")
    subprocess.run(["dpkg", "-x", deb, tree], check=True)
    return tree, version


def state(tree: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for folder, _dirs, files in os.walk(tree):
        for name in files:
            p = Path(folder) / name
            if p.is_file() and not p.is_symlink():
                out[str(p)] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


def rewrite(tree: Path, jobs: int) -> tuple[dict[str, Any], float, int]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "usdtpatch", "rewrite", "--tree", str(tree),
                           "-j", str(jobs), "--json"], capture_output=True, text=True,
                          env=env, check=False)
    took = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"distro_run: {tree}: exit {proc.returncode}: {proc.stderr.strip()}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc, took, proc.returncode


def row(package: str, version: str, doc: dict[str, Any], first: float, second: float,
        rc: int, same: bool) -> dict[str, Any]:
    t = doc["tree"]
    sites = sum(sum(e["counts"].values()) for e in doc["files"])
    converted = sum(n for e in doc["files"] for k, n in e["counts"].items() if k in CONVERTED)
    return {"package": package, "version": version, "regular": t["regular"], "elf": t["elf"],
            "with_probes": t["with_probes"], "rewritten": t["rewritten"],
            "sites": sites, "converted": converted, "refused": t["refused"],
            "refusals": [e["error"] for e in doc["errors"]],
            "files": [(e["path"], sum(e["counts"].values()),
                       sum(n for k, n in e["counts"].items() if k in CONVERTED))
                      for e in doc["files"]],
            "first": round(first, 1), "second": round(second, 1), "exit": rc,
            "second_changed_nothing": same}


def markdown(rows: list[dict[str, Any]], work: Path) -> str:
    lines = ["| package | version | regular files | ELF | with probes | rewritten | sites "
             "converted | refused | time | second run |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| `{r['package']}` | {r['version']} | {r['regular']} | {r['elf']} | "
                     f"{r['with_probes']} | {r['rewritten']} | {r['converted']} of {r['sites']} "
                     f"| {r['refused']} | {r['first']} s | {r['second']} s, "
                     f"{'nothing changed' if r['second_changed_nothing'] else 'CHANGED'} |")
    tot = {k: sum(r[k] for r in rows) for k in ("regular", "elf", "with_probes", "rewritten",
                                                 "sites", "converted", "refused", "first")}
    lines.append(f"| **total** | | {tot['regular']} | {tot['elf']} | {tot['with_probes']} | "
                 f"{tot['rewritten']} | {tot['converted']} of {tot['sites']} | "
                 f"{tot['refused']} | {tot['first']:.1f} s | |")
    lines.append("")
    lines.append("| package | file | sites | converted |")
    lines.append("|---|---|---:|---:|")
    for r in rows:
        for path, sites, conv in r["files"]:
            rel = os.path.relpath(path, work / r["package"])
            lines.append(f"| `{r['package']}` | `{rel}` | {sites} | {conv} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.distro_run", description=__doc__)
    ap.add_argument("work", type=Path, help="the folder the packages are unpacked into")
    ap.add_argument("packages", nargs="+")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--markdown", action="store_true", help="print the tables for the docs")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for package in args.packages:
        tree, version = stage(package, args.work)
        doc, first, rc = rewrite(tree, args.jobs)
        before = state(tree)
        _doc2, second, _rc2 = rewrite(tree, args.jobs)
        rows.append(row(package, version, doc, first, second, rc, state(tree) == before))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.markdown:
        print(markdown(rows, args.work))
    else:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
