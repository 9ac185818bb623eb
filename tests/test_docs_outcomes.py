"""docs/outcomes.md's table is what `check --summary` says of each real binary (issue 34,
item 8: the python3.11 row read 8 forward, check said 7 forward and 1 backward)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import REAL_BINARIES, ROOT, run_cli

_SUMMARY = re.compile(r"(\d+) site\(s\): (\d+) optimizable as they are; \d+ after rewrite "
                      r"\((\d+) in place, (\d+) forward, (\d+) backward\); (\d+) blocked")


def table_row(page: str, path: str) -> list[int]:
    """The numbers of the outcomes table's row naming `path` (probes, optimizable, in place,
    forward, backward, blocked)."""
    row = next(line for line in page.splitlines() if line.startswith("|") and f"`{path}" in line)
    cells = [c.strip().strip("*").split(" ")[0] for c in row.split("|")[2:8]]
    return [int(c.strip("*")) for c in cells]


def test_table_row_reads_a_row() -> None:
    page = "| x (`/a/b`) | 8 | 0 | 0 | **7** (3%) | 1 | 0 | - |\n"
    assert table_row(page, "/a/b") == [8, 0, 0, 7, 1, 0]
    with pytest.raises(StopIteration):
        table_row(page, "/c")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REAL_BINARIES))
def test_outcomes_table_is_checks(name: str) -> None:
    path = REAL_BINARIES[name]
    if not path.exists():
        pytest.skip(f"{path} not installed")
    page = (ROOT / "docs" / "outcomes.md").read_text()
    # the table names the file by the path it was measured at (libstdc++'s versioned name)
    measured = next(p for p in re.findall(r"\(`(/[^`]+)`\)", page)
                    if Path(p).resolve() == path.resolve())
    res = run_cli("check", "--summary", "--fail-on", "never", path)
    m = _SUMMARY.search(res.out)
    assert m, res.out
    assert table_row(page, measured) == [int(g) for g in m.groups()]


def test_readme_says_how_detours_are_verified() -> None:
    """The README said every detour is run in the emulator from 64 random states; the
    rewrite proves them and emulates only what the prover cannot decide: the README names
    each verification the report gives and what "proved" rests on."""
    from usdtpatch.report.plain import VERIFICATIONS

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### `usdtpatch rewrite"):readme.index("### `usdtpatch plan")]
    for word in VERIFICATIONS[:2]:
        assert f"`{word}`" in section, word
    assert "What is assumed" in section
    assert not re.search(r"Every detour is run [^.]* in the emulator", section)
