"""Fetch and unpack a Debian source package with a private apt configuration:
`python -m tools.fetch_source PACKAGE DEST [--cache DIR]` (`make bpftrace-src`).

The version is the installed binary package's (`dpkg-query`), so the sources are those of the
very program the tests run. apt gets its own configuration under the cache directory: one
deb-src entry for the archive the installed version comes from (its URI, suite and component,
as `apt-cache madison` names them, and the Signed-By keyring of the system's entry for that
URI), and its own state, lists and cache directories. Nothing is installed and nothing of the
system's apt configuration is read for sources or changed. The .dsc, .orig and .debian files
are unpacked with `dpkg-source -x` (or, without dpkg-dev, the tarballs with tar) into DEST
(replaced as a whole: DEST.new, then renamed), with the version in DEST/.version.

Exit status 0 when DEST holds the sources (fetched now or already there), 1 with one line on
stderr when they cannot be had (no apt, no network to the archive, no such version): the tests
that need them then skip with that reason, which DEST.error keeps.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


class FetchError(Exception):
    pass


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 300) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"{cmd[0]}: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["failed"]
        raise FetchError(f"{' '.join(cmd[:3])}...: {last[0]}")
    return proc.stdout


def installed_version(package: str) -> str:
    try:
        out = _run(["dpkg-query", "-W", "-f=${Version}", package]).strip()
    except FetchError:
        out = ""
    if not out:
        raise FetchError(f"{package} is not installed")
    return out


def source_name(package: str) -> str:
    out = _run(["dpkg-query", "-W", "-f=${source:Package}", package]).strip()
    return out or package


def archive_of(package: str, version: str) -> tuple[str, str, str]:
    """(URI, suite, component) of the archive that has `package` at `version`."""
    for line in _run(["apt-cache", "madison", package]).splitlines():
        cols = [c.strip() for c in line.split("|")]
        if len(cols) >= 3 and cols[1] == version:
            m = re.match(r"(\S+) (\S+?)/(\S+) \S+ Packages$", cols[2])
            if m:
                return m[1], m[2], m[3]
    raise FetchError(f"no archive of the system's apt sources has {package} {version}")


def signed_by(uri: str) -> str | None:
    """The Signed-By keyring of the system's entry for `uri` (deb822 or one-line)."""
    files = sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
    for path in files:
        for stanza in Path(path).read_text(errors="replace").split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
            if uri.rstrip("/") in (u.rstrip("/") for u in fields.get("uris", "").split()):
                return fields.get("signed-by")
    one_line = ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]
    for path in one_line:
        if not os.path.isfile(path):
            continue
        for line in Path(path).read_text(errors="replace").splitlines():
            m = re.match(r"\s*deb\s+\[([^\]]*)\]\s+(\S+)", line)
            if m and m[2].rstrip("/") == uri.rstrip("/"):
                opt = re.search(r"signed-by=(\S+)", m[1])
                return opt[1] if opt else None
    return None


def apt_options(conf: Path) -> list[str]:
    return ["-o", f"Dir::Etc::SourceList={conf / 'sources.list'}",
            "-o", f"Dir::Etc::SourceParts={conf / 'sources.list.d'}",
            "-o", f"Dir::State={conf / 'state'}",
            "-o", f"Dir::State::Lists={conf / 'lists'}",
            "-o", f"Dir::Cache={conf / 'cache'}",
            "-o", "Dir::State::status=/var/lib/dpkg/status",
            "-o", "APT::Sandbox::User=root",
            "-o", "Acquire::Languages=none",
            "-o", "Debug::NoLocking=1", "-qq"]


def fetch(package: str, dest: Path, cache: Path) -> str:
    if not shutil.which("apt-get"):
        raise FetchError("apt-get is needed")
    version = installed_version(package)
    stamp = dest / ".version"
    if stamp.is_file() and stamp.read_text().strip() == version:
        return version
    src = source_name(package)
    uri, suite, component = archive_of(package, version)
    conf = cache.resolve() / "apt-src"
    shutil.rmtree(conf, ignore_errors=True)
    for sub in ("sources.list.d", "state", "lists/partial", "cache/archives/partial"):
        (conf / sub).mkdir(parents=True, exist_ok=True)
    key = signed_by(uri)
    opts = f" [signed-by={key}]" if key else ""
    (conf / "sources.list").write_text(f"deb-src{opts} {uri} {suite} {component}\n")
    _run(["apt-get", *apt_options(conf), "update"], timeout=600)
    download = cache.resolve() / f"{src}-download"
    shutil.rmtree(download, ignore_errors=True)
    download.mkdir(parents=True)
    _run(["apt-get", *apt_options(conf), "source", "--download-only", f"{src}={version}"],
         cwd=download, timeout=600)
    dscs = sorted(download.glob("*.dsc"))
    if not dscs:
        raise FetchError(f"apt-get source fetched no .dsc for {src}={version}")
    new = dest.with_name(dest.name + ".new")
    shutil.rmtree(new, ignore_errors=True)
    if shutil.which("dpkg-source"):
        _run(["dpkg-source", "--no-check", "-x", str(dscs[0]), str(new)], timeout=600)
    else:
        _untar(download, new)
    (new / ".version").write_text(version + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    new.rename(dest)
    shutil.rmtree(download, ignore_errors=True)
    return version


def _untar(download: Path, new: Path) -> None:
    """Without dpkg-dev: the upstream tarball into `new` (its top folder stripped) and the
    debian/ tarball into new/debian (a 3.0 (quilt) package's patches are not applied: tell it
    by the debian/patches/series left in place)."""
    origs = sorted(download.glob("*.orig.tar.*"))
    debs = sorted(download.glob("*.debian.tar.*"))
    if len(origs) != 1:
        raise FetchError(f"no dpkg-source, and {len(origs)} .orig tarballs to unpack")
    new.mkdir(parents=True)
    _run(["tar", "-xf", str(origs[0]), "-C", str(new), "--strip-components=1"], timeout=600)
    for deb in debs:
        _run(["tar", "-xf", str(deb), "-C", str(new)], timeout=600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fetch_source",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("package", help="the installed binary package whose source to fetch")
    parser.add_argument("dest", type=Path, help="the directory to unpack the sources into")
    parser.add_argument("--cache", type=Path, default=Path("build/cache"),
                        help="where apt's private configuration and downloads go")
    args = parser.parse_args(argv)
    err = args.dest.with_name(args.dest.name + ".error")
    try:
        version = fetch(args.package, args.dest, args.cache)
    except FetchError as exc:
        err.parent.mkdir(parents=True, exist_ok=True)
        err.write_text(f"{exc}\n")
        print(f"note: no {args.package} sources ({exc}); the tests that need them skip",
              file=sys.stderr)
        return 1
    err.unlink(missing_ok=True)
    print(f"{args.package} {version} sources in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
