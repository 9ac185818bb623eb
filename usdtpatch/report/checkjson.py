"""The `check` report as data: a versioned JSON document (schema in docs/check-json.md).

Every renderer (rich table, SARIF, HTML) reads this document, so the outputs cannot drift apart.

Deferred imports: elf/demangle.py (c++filt), only when result_json is not given the names;
json, marshal and zlib, only for the JSON text (not for the table).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from usdtpatch.analysis.check import (
    BACKWARD,
    BLOCKED,
    FORWARD,
    IN_PLACE,
    NOT_APPLICABLE,
    OPTIMIZABLE,
    CheckReport,
    Keep,
    SiteCheck,
)
from usdtpatch.analysis.probes import ProbeSet
from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.findings import Finding, Severity
from usdtpatch.prove.support import provable
from usdtpatch.report.envelope import envelope
from usdtpatch.report.listing import function_label, site_disassembly
from usdtpatch.report.plain import JoinedRows, check_cells, finding_line

if TYPE_CHECKING:
    from usdtpatch.api import CheckResult

CHECK_SCHEMA = "usdtpatch/analysis"
CHECK_SCHEMA_VERSION = 2  # 2: `kernels` keyed by generation name (nop5, nop10)


def window_json(w: PatchWindow) -> dict[str, Any]:
    return {
        "shape": w.shape.value,
        "start": w.start,
        "end": w.end,
        "probe_offset": w.probe_offset,
        "probe_length": w.probe_length,
        "relocated_bytes": w.relocated_bytes,
        "extra_jumps": w.extra_jumps,
        "start_reason": w.start_reason,
        "end_reason": w.end_reason,
        "replacement": w.replacement.hex() if w.replacement is not None else None,
        "internal_targets": list(w.internal_targets),
        "padding_bytes": w.padding_bytes,
        "calls": list(w.calls),
        "retargets": [{"target": r.target, "source": r.source, "how": r.how, "kind": r.kind,
                       "stub": r.stub} for r in w.retargets],
        "instructions": [
            {"address": i.address, "bytes": w.code[i.address - w.start: i.end - w.start].hex(),
             "text": i.text} for i in w.insns
        ],
    }


def site_json(s: SiteCheck, names: dict[str, str], mode64: bool) -> dict[str, Any]:
    p = s.probe
    wr = s.window
    return {
        "provider": p.provider,
        "name": p.name,
        "address": p.address,
        "file_offset": p.offset,
        "function": function_label(p, names),
        "function_bounds": None if s.function is None else {
            "start": s.function.start, "end": s.function.end, "source": s.function.source},
        "site": {"form": p.site.form.value, "length": p.site.length, "bytes": p.code.hex(),
                 "disassembly": site_disassembly(p, mode64)},
        "kernels": {k: {"outcome": v.outcome.value, "reason": v.reason}
                    for k, v in s.candidacy.items()},
        "outcome": s.outcome,
        "blocked": None if s.blocked is None else {
            "code": s.blocked, "reason": wr.reason if wr is not None and wr.window is None
            else next((f.message for f in s.findings if f.code == s.blocked), s.blocked)},
        "window": None if wr is None or wr.window is None else window_json(wr.window),
        "provable": None if wr is None or wr.window is None else _provable_json(wr.window),
        "window_attempts": list(wr.tried) if wr is not None else [],
        "red_zone": None if s.red_zone is None else {
            "may_use": s.red_zone.may_use, "reason": s.red_zone.reason},
        "findings": [f.to_json() for f in s.findings],
    }


def _provable_json(w: PatchWindow) -> dict[str, Any]:
    """Whether a rewrite is expected to prove the window's detour (usdtpatch.prove.support)."""
    why = provable(w)
    return {"expected": why is None, "reason": why}


def summary_json(r: CheckReport, counted: tuple[int, int] | None = None) -> dict[str, Any]:
    """The file's summary; `counted`: (windows, provable) counted as the sites' entries were
    made (a report whose sites kept no window: cmd_check's writer)."""
    oc = r.outcome_counts()
    windows = [s.window.window for s in r.sites if s.window is not None
               and s.window.window is not None]
    n_windows, n_provable = counted if counted is not None else (
        len(windows), sum(1 for w in windows if provable(w) is None))
    return {
        "sites": len(r.sites),
        "optimizable": oc[OPTIMIZABLE],
        "after_rewrite": {"in_place": oc[IN_PLACE], "forward": oc[FORWARD],
                          "backward": oc[BACKWARD]},
        "blocked": oc[BLOCKED],
        "blocked_by_reason": r.blocked_counts(),
        "not_applicable": oc[NOT_APPLICABLE],
        # of the sites with a window: how many a rewrite should prove when it moves the
        # window to a detour (usdtpatch.prove.support)
        "windows": n_windows,
        "provable": n_provable,
    }


def check_file_json(path: str, r: CheckReport, names: dict[str, str],
                    sites: Any = None, counted: tuple[int, int] | None = None
                    ) -> dict[str, Any]:
    """The file's entry; `sites` and `counted`, when given, stand for its sites' entries and
    the summary's window counts (cmd_check's writer, which made them as each site was
    decided)."""
    img = r.probeset.image
    return {
        "path": path,
        "elf": {"class": 64 if img.is64 else 32,
                "byteorder": "little" if img.little_endian else "big",
                "machine": img.machine_name, "type": img.type},
        "cfi": {"source": r.cfi_source, "fdes": r.cfi_fdes},
        "fork_imports": list(r.fork_imports),
        "summary": summary_json(r, counted),
        "sites": [site_json(s, names, img.is64) for s in r.sites] if sites is None else sites,
        "findings": [f.to_json() for f in r.findings],
    }


def result_json(result: CheckResult, names: dict[str, str] | None = None,
                path: str | None = None) -> dict[str, Any]:
    """The file's entry of the check document of `usdtpatch.api.check`'s result. `names`:
    demangled function names (looked up here when not given); `path`: the name the entry
    gives the file (default: the result's)."""
    if names is None:
        from usdtpatch.elf.demangle import demangle

        names = demangle([s.probe.function for s in result.report.sites if s.probe.function])
    return check_file_json(result.path if path is None else path, result.report, names)


class Encoded(list[bytes]):
    """The items of a list of a JSON document encoded ahead of it: each item marshalled
    (the same values back, dict order kept, in this process; twice as fast as JSON text
    and back) and zlib-compressed with `zdict` (an item like them marshalled: a site's
    entry, ~1.1 KB, is ~100 bytes so, ~600 without), read back one at a time as json_pieces
    writes the list. Only json_pieces writes it (json's indented encoder iterates a list
    with `for`, which reads it back; the compact encoder would not)."""

    def __init__(self, items: Iterable[bytes] = (), zdict: bytes | None = None) -> None:
        super().__init__(items)
        self.zdict = zdict

    @staticmethod
    def plain(item: Any) -> bytes:
        """`item` marshalled, uncompressed (a `zdict` for items like it)."""
        import marshal

        return marshal.dumps(item)

    @staticmethod
    def encode(item: Any, zdict: bytes | None = None) -> bytes:
        import zlib

        packer = zlib.compressobj(1) if zdict is None else zlib.compressobj(1, zdict=zdict)
        return packer.compress(Encoded.plain(item)) + packer.flush()

    def __iter__(self) -> Iterator[Any]:
        import marshal
        import zlib

        for blob in super().__iter__():
            unpacker = zlib.decompressobj() if self.zdict is None else \
                zlib.decompressobj(zdict=self.zdict)
            yield marshal.loads(unpacker.decompress(blob) + unpacker.flush())


def json_pieces(doc: Any) -> Iterator[str]:
    """The text of json.dumps(doc, indent=2) and a newline, in pieces of about 64 KiB (an
    Encoded list written as its items). With an indent, json.dumps joins a list of every
    token (a few small strings per field: 120 MB at 10,000 sites, more than the analysis and
    the document together); a few large pieces keep the writes few and the memory the
    text's."""
    import json

    pieces: list[str] = []
    size = 0
    for token in json.JSONEncoder(indent=2).iterencode(doc):
        pieces.append(token)
        size += len(token)
        if size >= 1 << 16:
            yield "".join(pieces)
            pieces.clear()
            size = 0
    pieces.append("\n")
    yield "".join(pieces)


class SiteWriter:
    """The entries of `check --json` and the table made site by site (cmd_check's
    written_document): each site's entry made when the check decides the site (its JSON
    text, compressed, or its table row and finding lines), and nothing of the site's window
    kept past it; `start` is usdtpatch.api.check_keeping's `keep`."""

    def __init__(self, table: bool) -> None:
        self.table = table
        self.functions: list[str] = []  # every file's, for the note of a missing c++filt
        # the file's sites' entries (JSON) or rows (table), by their notes' index
        self.entries: list[Any] = []
        self.lines: dict[int, tuple[str, ...]] = {}  # the finding lines of a site with any
        self.windows = 0
        self.provable = 0
        self.names: dict[str, str] = {}
        self.mode64 = True
        self.zdict: bytes | None = None  # the file's entries are compressed with it

    def start(self, probes: ProbeSet) -> Keep:
        """api.check's `keep`: the file's names and a fresh tally, then `_keep`."""
        from usdtpatch.elf.demangle import demangle

        functions = [p.function for p in probes.probes if p.function]
        self.functions += functions
        self.names = demangle(functions)
        self.mode64 = probes.image.is64
        self.entries = [None] * (max((p.index for p in probes.probes), default=-1) + 1)
        self.lines = {}
        self.zdict = None
        self.windows = self.provable = 0
        return self._keep

    def _keep(self, sc: SiteCheck) -> SiteCheck:
        entry = site_json(sc, self.names, self.mode64)
        if entry["window"] is not None:
            self.windows += 1
            self.provable += entry["provable"]["expected"]
        index = sc.probe.index
        if self.table:
            self.entries[index] = JoinedRows.join(check_cells(entry))
            if entry["findings"]:
                self.lines[index] = tuple(finding_line(f) for f in entry["findings"])
        else:
            if self.zdict is None:  # the file's first site's: its sites are alike
                self.zdict = Encoded.plain(entry)
            self.entries[index] = Encoded.encode(entry, self.zdict)
        # what the file's own findings, the summary and the exit status read
        return SiteCheck(probe=sc.probe, candidacy=sc.candidacy, outcome=sc.outcome,
                         blocked=sc.blocked, window=None, red_zone=None, function=None,
                         findings=sc.findings)

    def file(self, r: CheckResult) -> dict[str, Any]:
        """The file's entry of the document, its sites' entries in note order."""
        order = [s.probe.index for s in r.report.sites]
        made = [self.entries[i] for i in order]
        self.entries = []
        counted = (self.windows, self.provable)
        if not self.table:
            return check_file_json(r.path, r.report, {}, Encoded(made, self.zdict), counted)
        got = check_file_json(r.path, r.report, {}, [], counted)
        got["rows"] = JoinedRows(made)
        got["finding_lines"] = [line for i in order for line in self.lines.get(i, ())]
        return got


def check_document(files: list[dict[str, Any]], errors: list[dict[str, str]],
                   fail_on: str = "error") -> dict[str, Any]:
    return {**envelope(CHECK_SCHEMA, CHECK_SCHEMA_VERSION), "fail_on": fail_on, "files": files,
            "errors": errors}


def document_findings(doc: dict[str, Any]) -> list[dict[str, str]]:
    """Every finding of a check document (file-level and per site)."""
    out: list[dict[str, str]] = []
    for f in doc["files"]:
        out.extend(f["findings"])
        for s in f["sites"]:
            out.extend(s["findings"])
    return out


def reaches(findings: list[Finding] | list[dict[str, str]], fail_on: str) -> bool:
    """True when some finding's severity is at or above `fail_on` ("never" never fails)."""
    if fail_on == "never":
        return False
    limit = Severity(fail_on).rank
    for f in findings:
        sev = f.severity if isinstance(f, Finding) else Severity(f["severity"])
        if sev.rank >= limit:
            return True
    return False
