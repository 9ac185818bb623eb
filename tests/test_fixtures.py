"""The committed fixture binaries are the ones MANIFEST describes (sha256 per file)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT, fixture_files


def test_manifest_matches_the_committed_binaries() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "fixtures" / "manifest.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_manifest_lists_every_binary() -> None:
    listed = {line.split()[1] for line in (ROOT / "fixtures" / "MANIFEST").read_text()
              .splitlines() if line.strip() and not line.startswith("#")}
    on_disk = {f"bin/{p.name}" for p in fixture_files()}
    assert on_disk <= listed, sorted(on_disk - listed)
