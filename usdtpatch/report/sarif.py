"""SARIF 2.1.0 output of a check document, so CI systems (GitHub code scanning, GitLab, Azure
DevOps) can show the findings.

Reference: OASIS SARIF 2.1.0 (https://docs.oasis-open.org/sarif/sarif/v2.1.0/): a `sarifLog`
with `version` "2.1.0" and `$schema`, one `run` with `tool.driver` (name, version, rules) and
`results` (ruleId, ruleIndex, level "error"/"warning"/"note", message.text, locations).
A binary has no source lines: each result's location is the ELF file as an artifact, with the
probe address as a `binary` region (`byteOffset` = the site's file offset) and a logical
location naming the probe. Each rule carries its help inline (`help.text` and
`help.markdown`: the code's section of docs/findings.md, shipped in the package), since the
reader of a CI's code-scanning view has no usdtpatch source tree to follow a link into.
"""

from __future__ import annotations

from typing import Any

from usdtpatch.findings import documentation, is_registered, lookup
from usdtpatch.version import __version__

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _rule(f: dict[str, str]) -> dict[str, Any]:
    """The SARIF rule of a finding's code, with the code's documentation as its help."""
    code = f["code"]
    title = lookup(code).title if is_registered(code) else code
    doc = documentation(code) if is_registered(code) else ""
    text = doc or f["hint"] or title
    return {
        "id": code,
        "name": "".join(p.capitalize() for p in code.split("-")),
        "shortDescription": {"text": title},
        "fullDescription": {"text": f"{code}: {title}"},
        "help": {"text": f"{text}\n(usdtpatch explain {code} prints this)",
                 "markdown": f"{text}\n\n(`usdtpatch explain {code}` prints this)"},
        "defaultConfiguration": {"level": _LEVEL[f["severity"]]},
    }


def sarif_document(doc: dict[str, Any]) -> dict[str, Any]:
    """Convert a `usdtpatch/analysis` document into a SARIF 2.1.0 log."""
    rules: dict[str, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []

    def rule_index(f: dict[str, str]) -> int:
        if f["code"] not in rules:
            rules[f["code"]] = _rule(f)
        return list(rules).index(f["code"])

    for file in doc["files"]:
        artifact = {"uri": file["path"]}
        for f in file["findings"]:
            results.append(_result(f, rule_index(f), artifact, None, None))
        for s in file["sites"]:
            for f in s["findings"]:
                results.append(_result(f, rule_index(f), artifact, s, f"{s['provider']}:"
                                                                      f"{s['name']}"))
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [{
            "tool": {"driver": {"name": "usdtpatch", "version": __version__,
                                "rules": list(rules.values())}},
            "results": results,
        }],
    }


def _result(f: dict[str, str], index: int, artifact: dict[str, str],
            site: dict[str, Any] | None, probe: str | None) -> dict[str, Any]:
    text = f["message"] + (f" Hint: {f['hint']}" if f["hint"] else "")
    loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": dict(artifact)}}
    if site is not None and site.get("file_offset") is not None:
        loc["physicalLocation"]["region"] = {"byteOffset": site["file_offset"],
                                             "byteLength": max(1, site["site"]["length"])}
        loc["physicalLocation"]["address"] = {"absoluteAddress": site["address"]}
    if probe is not None or f["where"]:
        loc["logicalLocations"] = [{"name": probe or f["where"], "kind": "function"
                                    if probe else "module"}]
        if site is not None and site.get("function"):
            loc["logicalLocations"][0]["fullyQualifiedName"] = f"{site['function']}/{probe}"
    return {"ruleId": f["code"], "ruleIndex": index, "level": _LEVEL[f["severity"]],
            "message": {"text": text}, "locations": [loc]}
