"""examples/README.md's build lines (issue 47, item 10): CMake and Meson were built in the same
`build/`, where Meson overwrote CMake's `build/app` while CMake still said "Built target app".
Each build of the table writes to a folder of its own, none of them the checkout's `build/`
itself (`make wheel`'s `build/wheels` lives there)."""

from __future__ import annotations

import re

from tests.helpers import ROOT


def _build_folders() -> dict[str, str]:
    rows = [ln for ln in (ROOT / "examples" / "README.md").read_text().splitlines()
            if ln.startswith("| `") and ("cmake " in ln or "meson " in ln)]
    folders: dict[str, str] = {}
    for row in rows:
        tool = "cmake" if "cmake -S" in row else "meson"
        m = re.search(r"-B (\S+)", row) if tool == "cmake" else \
            re.search(r"meson setup (\S+)", row)
        assert m is not None, row
        folders[tool] = m.group(1)
        # the build step builds where the configure step wrote
        step = re.search(r"cmake --build (\S+?)`", row) if tool == "cmake" else \
            re.search(r"meson compile -C (\S+?)`", row)
        assert step is not None and step.group(1) == m.group(1), row
    return folders


def test_each_example_build_has_its_own_folder() -> None:
    folders = _build_folders()
    assert set(folders) == {"cmake", "meson"}
    assert len(set(folders.values())) == len(folders), folders
    assert all(f.rstrip("/") != "build" and f.startswith("build/") for f in folders.values())
