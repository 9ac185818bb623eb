"""`usdtpatch list --json` against binutils `readelf -n`, and the note round trip.

For every committed fixture and the real binaries of this machine, each SDT note readelf
shows must be listed by usdtpatch with the same provider, name, pc, base, semaphore and
argument string, in the same order; and parse -> serialize gives the note section back byte
for byte.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import REAL_BINARIES, fixture_files, readelf_sdt_notes, run_cli
from usdtpatch.analysis.probes import NOTE_SECTION
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.notes import parse_notes, serialize_notes

pytestmark = pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils readelf missing")

# Fixtures made to hold a note readelf and usdtpatch must disagree about (a malformed note):
# the well-formed notes are still compared; the malformed one is checked in test_bad_input.
MALFORMED = {"odd-note"}


def _inputs() -> list[tuple[str, Path]]:
    items = [(f"fixture:{p.name}", p) for p in fixture_files()]
    items += [(f"real:{name}", path) for name, path in REAL_BINARIES.items()]
    return items


INPUTS = _inputs()


@pytest.mark.parametrize("path", [p for _, p in INPUTS], ids=[i for i, _ in INPUTS])
def test_list_json_agrees_with_readelf(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    oracle = readelf_sdt_notes(path)
    res = run_cli("list", "--json", path)
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert doc["schema"] == "usdtpatch/list" and doc["schema_version"] == 1
    probes = doc["files"][0]["probes"]
    ours = [(p["provider"], p["name"], p["note"]["pc"], p["note"]["base"],
             p["note"]["semaphore"], p["note"]["args"]) for p in probes]
    theirs = [(n.provider, n.name, n.pc, n.base, n.semaphore, n.args) for n in oracle]
    if path.name in MALFORMED:
        assert set(ours) <= set(theirs) and ours, "every well-formed note is listed"
    else:
        assert ours == theirs
    assert doc["files"][0]["probe_count"] == len(probes)


@pytest.mark.parametrize("path", [p for _, p in INPUTS], ids=[i for i, _ in INPUTS])
def test_note_section_round_trip_is_byte_exact(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    image = parse_elf(path.read_bytes())
    sec = image.section(NOTE_SECTION)
    if sec is None:
        pytest.skip(f"{path.name} has no {NOTE_SECTION}")
    data = image.section_data(sec)
    parsed = parse_notes(data, image.word_size, image.byteorder)
    assert serialize_notes(parsed, image.word_size, image.byteorder) == data


def test_real_binaries_have_the_expected_probe_counts() -> None:
    """The machine facts this suite relies on (8, 3 and 531 probes)."""
    expected = {"python3.11": 8, "libstdc++": 3, "libjvm": 531}
    for name, path in REAL_BINARIES.items():
        if not path.exists():
            continue
        doc = json.loads(run_cli("list", "--json", path).out)
        assert doc["files"][0]["probe_count"] == expected[name], name
