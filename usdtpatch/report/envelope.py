"""The opening every versioned document of usdtpatch has: its schema, the schema's version
and (in most) the tool that wrote it. The one place a document's envelope is made
(tests/test_structure.py: no module outside report/ makes one).

Three forms, each the schema it belongs to has had since its version 1:
- `tool` an object {"name": "usdtpatch", "version": ...}: list, check, rewrite, build-report;
- `tool` one string "usdtpatch X.Y.Z": the plan document (read back by `verify --plan`);
- no `tool`: verify, show, kcheck, bench.
"""

from __future__ import annotations

from usdtpatch.version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`list` does not)
if TYPE_CHECKING:
    from typing import Any, Literal

TOOL_NAME = "usdtpatch"


def envelope(schema: str, version: int,
             tool: Literal["object", "text", "none"] = "object") -> dict[str, Any]:
    """The first members of a document of `schema` at `version` (the rest follow in the
    order the document's page lists them)."""
    doc: dict[str, Any] = {"schema": schema, "schema_version": version}
    if tool == "object":
        doc["tool"] = {"name": TOOL_NAME, "version": __version__}
    elif tool == "text":
        doc["tool"] = f"{TOOL_NAME} {__version__}"
    return doc
