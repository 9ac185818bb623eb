"""Fetch the guest kernels the live guest tests boot: `python -m tools.fetch_kernels DEST
[--cache DIR] [KEY...]` (`make guest-kernels`, part of `make test`).

One kernel per guest key (GUESTS below), named by the kernel generation it is an example of
(docs/kernel.md: `none` = the uprobe syscall answers ENOSYS, nothing optimized; `nop5` = ENXIO;
`nop10` = EPROTO) and its release. Each comes from a Debian suite through a PRIVATE apt
configuration under CACHE/apt-kernels (its own sources list, state, lists and package cache;
tools/fetch_source.py's approach and options): the archive URIs and keyrings are the machine's
own, read at run time from /etc/apt/sources.list.d/*.sources and /etc/apt/sources.list (the
entry that carries the machine's release), with the suite each guest needs. Nothing is
installed and the system's apt configuration is not changed. The newest kernel of the wanted
series the suite carries is taken: its packages are downloaded with `apt-get download`,
unpacked with `dpkg -x` into DEST/KEY/root, and its modules indexed with `depmod -b` (kmod).

DEST/KEY/kernel.json then names the vmlinuz, the release (`uname -r`), the packages and their
versions; a kernel already there at the archive's newest version is kept as it is, and so is
one already there when the archive cannot be read or no longer carries the series (with a
note). When a kernel cannot be had (no apt, no network, the suite no longer carries it, and
none is there yet), DEST/KEY.error holds the reason in one line and the tests that need that
guest FAIL with it. Exit status 0 when
every kernel asked for is there, 1 otherwise (one line per missing kernel on stderr).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.fetch_source import FetchError, _run, apt_options, signed_by


@dataclass(frozen=True)
class GuestKernel:
    """A guest: the suite that carries its kernel (a codename or "{release}": the machine's
    own, with its -updates and -security suites) and the regular expressions of its packages'
    names (the first names the kernel image); group 1 of the first is the version part of the
    name that orders the candidates (the newest wins)."""

    key: str
    suite: str
    packages: tuple[str, ...]
    note: str


GUESTS: dict[str, GuestKernel] = {g.key: g for g in (
    # Debian 12's own 6.1: no uprobe syscall (ENOSYS), nothing optimized. The vmlinuz is under
    # boot/, the modules under lib/modules/.
    GuestKernel("none-6.1", "{release}", (r"linux-image-(6\.1\.0-\d+)-amd64",),
                "Debian 12's own kernel"),
    # Debian's experimental 7.3: the nop10 series (EPROTO). Image and modules are two
    # packages there (linux-binary-*, linux-modules-*), the modules under usr/lib/modules/.
    GuestKernel("nop10-7.3", "experimental",
                (r"linux-binary-(7\.3(?:\.\d+)?(?:\+\w+)?)-amd64", r"linux-modules-{0}-amd64"),
                "Debian's experimental 7.3"),
    # sid's 7.2.13: already the nop10 path (EPROTO), as measured (docs/kernel.md).
    GuestKernel("nop10-7.2.13", "unstable",
                (r"linux-binary-(7\.2\.13(?:\+\w+)?)-amd64", r"linux-modules-{0}-amd64"),
                "Debian's sid 7.2.13"),
)}


def os_release_codename() -> str:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        text = ""
    m = re.search(r"^VERSION_CODENAME=\"?([a-z]+)", text, re.M)
    if not m:
        raise FetchError("/etc/os-release names no VERSION_CODENAME")
    return m[1]


def system_entries() -> list[tuple[str, list[str], list[str]]]:
    """(URI, suites, components) of the machine's `deb` entries, deb822 and one-line."""
    out: list[tuple[str, list[str], list[str]]] = []
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for stanza in Path(path).read_text(errors="replace").split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
            if "deb" not in fields.get("types", "").split() or \
                    fields.get("enabled", "yes").lower() == "no":
                continue
            for uri in fields.get("uris", "").split():
                out.append((uri, fields.get("suites", "").split(),
                            fields.get("components", "main").split()))
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        if not os.path.isfile(path):
            continue
        for line in Path(path).read_text(errors="replace").splitlines():
            m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
            if m:
                out.append((m[1], [m[2]], m[3].split()))
    return out


def sources_list() -> str:
    """The private sources list: every machine entry of its release's suites as it is, and the
    archive that carries the release itself (its URI and keyring) with unstable and
    experimental."""
    release = os_release_codename()
    lines: list[str] = []
    archive: str | None = None
    for uri, suites, components in system_entries():
        key = signed_by(uri)
        opts = f"[signed-by={key}] " if key else ""
        for suite in suites:
            if suite == release or suite.startswith(release + "-"):
                lines.append(f"deb {opts}{uri} {suite} {' '.join(components)}")
                if suite == release and archive is None:
                    archive = uri
    if archive is None:
        raise FetchError(f"no apt source of this machine carries its release {release}")
    key = signed_by(archive)
    opts = f"[signed-by={key}] " if key else ""
    lines += [f"deb {opts}{archive} {suite} main" for suite in ("unstable", "experimental")]
    return "\n".join(lines) + "\n"


def private_apt(cache: Path) -> Path:
    """The private apt configuration under cache/apt-kernels, its lists brought up to date."""
    if not shutil.which("apt-get"):
        raise FetchError("apt-get is needed")
    conf = cache.resolve() / "apt-kernels"
    for sub in ("sources.list.d", "state", "lists/partial", "cache/archives/partial"):
        (conf / sub).mkdir(parents=True, exist_ok=True)
    (conf / "sources.list").write_text(sources_list())
    _run(["apt-get", *apt_options(conf), "update"], timeout=900)
    return conf


def versions(conf: Path, name: str) -> list[tuple[str, str]]:
    """(version, suite) of every `name` the private archive lists, newest first."""
    out: list[tuple[str, str]] = []
    for line in _run(["apt-cache", *apt_options(conf), "madison", name]).splitlines():
        cols = [c.strip() for c in line.split("|")]
        if len(cols) >= 3 and cols[2].endswith("Packages"):
            m = re.match(r"\S+ (\S+?)/\S+ \S+ Packages$", cols[2])
            out.append((cols[1], m[1] if m else ""))
    return out


def version_key(version: str) -> list[tuple[int, str]]:
    """A sort key for the version parts of package names (7.3, 7.3.1, 6.1.0-37)."""
    return [(int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.\-+~]", version)]


def newer(a: str, b: str) -> bool:
    """Debian version a > b (dpkg --compare-versions)."""
    return subprocess.run(["dpkg", "--compare-versions", a, "gt", b], check=False).returncode == 0


def choose(conf: Path, guest: GuestKernel) -> list[tuple[str, str]]:
    """The (package, version) pairs of the newest kernel the guest's suite carries."""
    release = os_release_codename()
    suites = {guest.suite.format(release=release)}
    suite_ok = (lambda s: s == release or s.startswith(release + "-")) \
        if guest.suite == "{release}" else (lambda s: s in suites)
    image_re = re.compile(guest.packages[0] + "$")
    # apt-cache's regular expressions are POSIX ones: it is asked for the literal prefix
    names = _run(["apt-cache", *apt_options(conf), "search", "--names-only",
                  "^" + guest.packages[0].split("(", 1)[0]])
    best: tuple[list[tuple[int, str]], str, str, str] | None = None  # (key, part, name, ver)
    for line in names.splitlines():
        name = line.split(" - ", 1)[0].strip()
        m = image_re.match(name)
        if not m:
            continue
        for version, suite in versions(conf, name):
            if not suite_ok(suite):
                continue
            key = version_key(m[1])
            if best is None or key > best[0] or (key == best[0] and newer(version, best[3])):
                best = (key, m[1], name, version)
    if best is None:
        raise FetchError(f"the {guest.suite.format(release=release)} suite carries no package "
                         f"named {guest.packages[0]} ({guest.note})")
    _key, part, image, version = best
    out = [(image, version)]
    for pattern in guest.packages[1:]:
        name = pattern.format(part)
        have = [v for v, s in versions(conf, name) if suite_ok(s)]
        if version not in have:
            raise FetchError(f"{image} {version} has no {name} of the same version")
        out.append((name, version))
    return out


def kernel_image(root: Path) -> tuple[Path, str]:
    """(vmlinuz, release) of the kernel unpacked under `root`."""
    images = sorted(root.glob("boot/vmlinuz-*")) + sorted(root.glob("usr/lib/modules/*/vmlinuz"))
    for image in images:
        release = image.name[len("vmlinuz-"):] if image.name.startswith("vmlinuz-") \
            else image.parent.name
        if (root / "lib/modules" / release).is_dir() or \
                (root / "usr/lib/modules" / release).is_dir():
            return image, release
    raise FetchError(f"no vmlinuz with its modules under {root}")


def unpack(conf: Path, guest: GuestKernel, pkgs: list[tuple[str, str]], dest: Path) -> dict[
        str, object]:
    download = conf / "cache" / "archives"
    debs: list[Path] = []
    for name, version in pkgs:
        have = sorted(download.glob(f"{name}_*.deb"))
        want = [d for d in have if _deb_version(d) == version]
        for old in have:
            if old not in want:
                old.unlink()
        if not want:
            _run(["apt-get", *apt_options(conf), "download", f"{name}={version}"],
                 cwd=download, timeout=1800)
            want = [d for d in sorted(download.glob(f"{name}_*.deb"))
                    if _deb_version(d) == version]
            if not want:
                raise FetchError(f"apt-get download fetched no {name} {version}")
        debs.append(want[0])
    new = dest / f"{guest.key}.new"
    shutil.rmtree(new, ignore_errors=True)
    root = new / "root"
    root.mkdir(parents=True)
    for deb in debs:
        _run(["dpkg", "-x", str(deb), str(root)], timeout=900)
    image, release = kernel_image(root)
    if not (root / "lib").exists() and (root / "usr/lib").is_dir():
        # kmod 30's depmod looks under BASE/lib/modules: the merged-/usr layout's modules
        # are found through a link, as on the merged-/usr systems these packages are for.
        (root / "lib").symlink_to("usr/lib")
    if not shutil.which("depmod") and not os.path.exists("/usr/sbin/depmod"):
        raise FetchError("depmod (kmod) is needed to index the guest kernel's modules")
    depmod = shutil.which("depmod") or "/usr/sbin/depmod"
    _run([depmod, "-b", str(root), release], timeout=900)
    info: dict[str, object] = {
        "key": guest.key, "release": release, "note": guest.note,
        "vmlinuz": str(image.relative_to(new)),
        "packages": {name: version for name, version in pkgs},
    }
    (new / "kernel.json").write_text(json.dumps(info, indent=1) + "\n")
    final = dest / guest.key
    shutil.rmtree(final, ignore_errors=True)
    new.rename(final)
    return info


def _deb_version(deb: Path) -> str:
    # NAME_VERSION_ARCH.deb, the epoch's ':' written as %3a
    parts = deb.name[:-len(".deb")].split("_")
    return parts[1].replace("%3a", ":") if len(parts) == 3 else ""


def present(dest: Path, key: str) -> dict[str, object] | None:
    """The kernel.json of guest `key` when its kernel is unpacked under `dest`."""
    try:
        info: dict[str, object] = json.loads((dest / key / "kernel.json").read_text())
    except (OSError, ValueError):
        return None
    return info if (dest / key / str(info.get("vmlinuz"))).is_file() else None


def fetch(guest: GuestKernel, dest: Path, conf: Path) -> dict[str, object]:
    pkgs = choose(conf, guest)
    info = present(dest, guest.key)
    if info is not None and info.get("packages") == dict(pkgs):
        return info
    return unpack(conf, guest, pkgs, dest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fetch_kernels",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dest", type=Path, help="where the kernels are unpacked, one per key")
    parser.add_argument("keys", nargs="*", default=list(GUESTS),
                        help=f"the guests to fetch (default: all of {', '.join(GUESTS)})")
    parser.add_argument("--cache", type=Path, default=Path("build/cache"),
                        help="where apt's private configuration and downloads go")
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    failed = 0
    conf: Path | None = None
    setup_error = ""
    try:
        conf = private_apt(args.cache)
    except FetchError as exc:
        setup_error = str(exc)
    for key in args.keys:
        err = args.dest / f"{key}.error"
        try:
            if key not in GUESTS:
                raise FetchError(f"no guest kernel named {key}")
            if conf is None:
                raise FetchError(f"the private apt configuration failed: {setup_error}")
            info = fetch(GUESTS[key], args.dest, conf)
        except FetchError as exc:
            kept = present(args.dest, key)
            if kept is not None:  # offline, or the suite moved on: the kernel we have serves
                err.unlink(missing_ok=True)
                print(f"note: {key}: keeping {kept['release']} ({exc})", file=sys.stderr)
                continue
            failed += 1
            err.write_text(f"{exc}\n")
            print(f"note: no {key} guest kernel ({exc}); the tests that need it fail",
                  file=sys.stderr)
            continue
        err.unlink(missing_ok=True)
        print(f"{key}: {info['release']} in {args.dest / key}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
