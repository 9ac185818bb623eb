"""What is said is what is done (issue 47, item 6): each claim a report makes about what
rewrite writes is compared with the rewritten file itself.

- `show`'s detour column is the detour rewrite writes, instruction by instruction (it left
  out the red-zone guard's `lea -0x80(%rsp),%rsp` / `lea 0x80(%rsp),%rsp`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import fixture
from usdtpatch import api
from usdtpatch.elf.image import parse_elf
from usdtpatch.report.show import site_views
from usdtpatch.x86.decode import disassemble


def _mnemonics(texts: list[str]) -> list[str]:
    return [t.split()[0] for t in texts if t]


@pytest.mark.parametrize("name", ["redzone-leaf", "demo", "args-O2"])
def test_shows_detour_is_the_detour_rewrite_writes(name: str, tmp_path: Path) -> None:
    out = tmp_path / name
    outcome = api.rewrite(fixture(name), out, form="nop5", redzone_guard="auto")
    image = parse_elf(out.read_bytes())
    result = api.check(fixture(name))
    views = {v["address"]: v for v in site_views(str(fixture(name)), result.report)}
    compared = 0
    for d in outcome.sites:
        if d.detour is None or d.probe.address not in views:
            continue
        written = disassemble(image.read_vaddr(d.detour.address, len(d.detour.code)),
                              d.detour.address)
        shown = [r["detour"] for r in views[d.probe.address]["rows"] if r["detour"]]
        if not shown:  # a site moved inside another's window: shown with that site
            continue
        assert _mnemonics(shown) == [i.mnemonic for i in written], (d.probe.probe_id, shown)
        assert _mnemonics(shown)[0].startswith("lea") == d.guarded
        compared += 1
    assert compared
