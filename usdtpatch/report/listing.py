"""The `list` report as data: a versioned JSON document (schema in docs/json-schema.md)."""

from __future__ import annotations

from fnmatch import fnmatchcase

from usdtpatch.analysis import probes as _probes
from usdtpatch.analysis.probes import Probe, ProbeSet
from usdtpatch.elf.args import ImmOperand, MemOperand, RegOperand, SdtArg, UnknownOperand
from usdtpatch.report.envelope import envelope
from usdtpatch.x86.describe import describe
from usdtpatch.x86.nops import FORMS, SiteForm

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`list` does not)
if TYPE_CHECKING:
    from typing import Any

LIST_SCHEMA = "usdtpatch/list"
LIST_SCHEMA_VERSION = 1


def function_label(probe: Probe, names: dict[str, str]) -> str | None:
    if probe.function is None:
        return None
    name = names.get(probe.function, probe.function)
    return f"{name}+{probe.function_offset:#x}" if probe.function_offset else name


def arg_json(arg: SdtArg) -> dict[str, Any]:
    out: dict[str, Any] = {"raw": arg.raw, "size": arg.size, "signed": arg.signed,
                           "float": arg.is_float, "kind": arg.kind}
    op = arg.operand
    if isinstance(op, RegOperand):
        out["register"] = op.reg
    elif isinstance(op, ImmOperand):
        out["value"] = op.value
        out["symbol"] = op.symbol
    elif isinstance(op, MemOperand):
        out.update(disp=op.disp, symbol=op.symbol, base=op.base, index=op.index, scale=op.scale)
    elif isinstance(op, UnknownOperand):
        out["reason"] = op.reason
    return out


def site_disassembly(probe: Probe, mode64: bool) -> str:
    form = probe.site.form
    if form in (SiteForm.UNMAPPED, SiteForm.UNSUPPORTED_ARCH):
        return ""
    return describe(probe.code, probe.address, FORMS[form].insns, mode64)


def probe_json(probe: Probe, names: dict[str, str], mode64: bool) -> dict[str, Any]:
    sem = probe.semaphore
    return {
        "provider": probe.provider,
        "name": probe.name,
        "address": probe.address,
        "file_offset": probe.offset,
        "note": {"offset": probe.note.offset, "pc": probe.note.pc, "base": probe.note.base,
                 "semaphore": probe.note.semaphore, "args": probe.note.args},
        "semaphore": None if sem is None else {"address": sem.address, "file_offset": sem.offset,
                                               "section": sem.section},
        "arguments": [arg_json(a) for a in probe.args],
        "site": {"form": probe.site.form.value, "length": probe.site.length,
                 "room": probe.site.room, "bytes": probe.code.hex(),
                 "disassembly": site_disassembly(probe, mode64)},
        "function": function_label(probe, names),
    }


PROBE_PATTERN_HELP = ("PROVIDER:NAME or NAME (any provider); shell patterns allowed: "
                      "'GetEnv*', 'hotspot:*', '*:gc__*'")


def probe_pattern(text: str) -> str:
    """The `--probe` option's one meaning in every command, as a shell pattern over
    "provider:name": PROVIDER:NAME as it is, a NAME alone for that name in any provider."""
    return text if ":" in text else f"*:{text}"


def probe_matches(pattern: str, provider: str, name: str) -> bool:
    """Whether `--probe pattern` selects the probe `provider:name` (the library's rule:
    usdtpatch.analysis.probes.probe_matches, which rewrite --probe asks too)."""
    return _probes.probe_matches(pattern, provider, name)


def selected(ps: ProbeSet, provider: str | None = None,
             probe_name: str | None = None) -> list[Probe]:
    """The probes of `ps` a listing shows: all, or those whose provider matches `provider`
    and that `--probe probe_name` selects (both shell patterns)."""
    return [p for p in ps.probes
            if (provider is None or fnmatchcase(p.provider, provider))
            and (probe_name is None or probe_matches(probe_name, p.provider, p.name))]


def file_json(path: str, ps: ProbeSet, names: dict[str, str],
              provider: str | None = None, probe_name: str | None = None) -> dict[str, Any]:
    img = ps.image
    return {
        "path": path,
        "elf": {"class": 64 if img.is64 else 32,
                "byteorder": "little" if img.little_endian else "big",
                "machine": img.machine_name, "type": img.type},
        "probe_count": len(ps.probes),
        "probes": [probe_json(p, names, img.is64) for p in selected(ps, provider, probe_name)],
        "findings": [f.to_json() for f in ps.findings],
    }


def relabel(doc: dict[str, Any], probes: list[Probe], names: dict[str, str]) -> None:
    """Set the function labels of a file_json document (whose `probes` are `probes`) from
    demangled `names` found after it was made."""
    for entry, probe in zip(doc["probes"], probes, strict=True):
        entry["function"] = function_label(probe, names)


def list_document(files: list[dict[str, Any]], errors: list[dict[str, str]]) -> dict[str, Any]:
    return {**envelope(LIST_SCHEMA, LIST_SCHEMA_VERSION), "files": files, "errors": errors}
