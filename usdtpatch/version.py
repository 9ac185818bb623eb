"""The package's version, in the lowest layer: every document, the restore marker and
`--version` name it, and none of them may import the package face (usdtpatch/__init__.py
re-exports it). pyproject.toml's `version` is the same string (tests/test_structure.py)."""

from __future__ import annotations

__version__ = "0.1.0"
