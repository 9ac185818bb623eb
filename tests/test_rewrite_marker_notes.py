"""The restore marker stays out of what tools print as notes (issue 33, item 3).

`readelf -n` printed a rewritten libjvm.so's marker (0x269c0 bytes of JSON as hex under
NT_VERSION): 612 KB instead of 137 KB. The marker is now an SHT_PROGBITS section (not
allocated, usdtpatch.elf.marker); restore stays byte for byte, and a marker of a file
rewritten before (the same bytes in an SHT_NOTE section) still restores.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REAL_BINARIES, run_cli
from usdtpatch.elf.image import SHT_NOTE, SHT_PROGBITS, parse_elf
from usdtpatch.elf.marker import MARKER_SECTION, marker_of

pytestmark = pytest.mark.slow


def _readelf_n(path: Path) -> int:
    run = subprocess.run(["readelf", "-n", "-W", str(path)], capture_output=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stderr
    return len(run.stdout)


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    if shutil.which("readelf") is None:
        pytest.skip("needs readelf (binutils)")
    out = {}
    tmp = tmp_path_factory.mktemp("marker")
    for name, path in REAL_BINARIES.items():
        if not path.exists():
            continue
        dst = tmp / name
        assert run_cli("rewrite", path, "-o", dst).rc == 0
        out[name] = (path, dst)
    if not out:
        pytest.skip("none of python3.11, libstdc++.so.6, libjvm.so is installed")
    return out


@pytest.mark.parametrize("name", list(REAL_BINARIES))
def test_readelf_n_prints_at_most_a_fifth_more(name: str,
                                              rewritten: dict[str, tuple[Path, Path]]) -> None:
    if name not in rewritten:
        pytest.skip(f"{REAL_BINARIES[name]} is not installed")
    orig, rw = rewritten[name]
    before, after = _readelf_n(orig), _readelf_n(rw)
    assert after <= 1.2 * before, (name, before, after)
    sec = parse_elf(rw.read_bytes()).section(MARKER_SECTION)
    assert sec is not None and sec.type == SHT_PROGBITS and not sec.allocated


@pytest.mark.parametrize("name", list(REAL_BINARIES))
def test_restore_is_byte_exact(name: str, rewritten: dict[str, tuple[Path, Path]],
                               tmp_path: Path) -> None:
    if name not in rewritten:
        pytest.skip(f"{REAL_BINARIES[name]} is not installed")
    orig, rw = rewritten[name]
    back = tmp_path / "back"
    assert run_cli("restore", rw, "-o", back).rc == 0
    assert back.read_bytes() == orig.read_bytes()


def _as_old_marker(data: bytes) -> bytes:
    """The file as an earlier version wrote it: the marker's section SHT_NOTE."""
    image = parse_elf(data)
    sec = image.section(MARKER_SECTION)
    assert sec is not None
    out = bytearray(data)
    struct.pack_into("<I", out, image.shoff + sec.index * 64 + 4, SHT_NOTE)
    return bytes(out)


def test_an_old_marker_still_restores(rewritten: dict[str, tuple[Path, Path]],
                                      tmp_path: Path) -> None:
    name = next(iter(rewritten))
    orig, rw = rewritten[name]
    old = tmp_path / "old"
    old.write_bytes(_as_old_marker(rw.read_bytes()))
    image = parse_elf(old.read_bytes())
    sec = image.section(MARKER_SECTION)
    assert sec is not None and sec.type == SHT_NOTE
    assert marker_of(image) == marker_of(parse_elf(rw.read_bytes()))
    back = tmp_path / "back"
    assert run_cli("restore", old, "-o", back).rc == 0
    assert back.read_bytes() == orig.read_bytes()
    assert run_cli("rewrite", old, "-o", tmp_path / "again").rc == 0  # copied, not rewritten
    assert (tmp_path / "again").read_bytes() == old.read_bytes()
