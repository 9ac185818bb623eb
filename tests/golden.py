"""Golden files: compare rendered output with tests/golden/NAME; regenerate with
USDTPATCH_UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("USDTPATCH_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with USDTPATCH_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"output differs from {path}"
