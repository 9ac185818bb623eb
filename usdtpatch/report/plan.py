"""The plan document (schema `usdtpatch/plan`, version 1, docs/plan-verify.md; read back by
usdtpatch.sequences.plan.plan_from_json) and `usdtpatch plan`'s text: every site's write
sequences, state by state."""

from __future__ import annotations

from typing import Any

from usdtpatch.report.envelope import envelope
from usdtpatch.sequences.plan import PLAN_SCHEMA, PLAN_SCHEMA_VERSION, Plan, SitePlan
from usdtpatch.sequences.sequences import Sequence, Step
from usdtpatch.x86.describe import describe


def step_json(step: Step, address: int) -> dict[str, Any]:
    return {"address": address + step.offset, "offset": step.offset, "write": step.data.hex(),
            "before": step.before.hex(),
            "after": step.after.hex(), "expect_byte0": step.expect_byte0,
            "serialize": step.serialize, "what": step.what}


def sequence_json(seq: Sequence | None) -> dict[str, Any] | None:
    if seq is None:
        return None
    return {"name": seq.name, "address": seq.address, "start": seq.start.hex(),
            "end": seq.end.hex(), "steps": [step_json(s, seq.address) for s in seq.steps]}


def site_json(site: SitePlan) -> dict[str, Any]:
    s = site.sequences
    return {
        "probe": site.probe, "index": site.index, "link_address": site.link_address,
        "address": site.address, "file_offset": site.file_offset, "entry": site.entry,
        "exit": site.exit, "guarded": site.guarded, "form": site.form,
        "protocol": None if s is None else s.protocol,
        "original": None if s is None else s.original.hex(),
        "trampoline": None if s is None else s.trampoline,
        "optimized": None if s is None or s.optimized is None else s.optimized.hex(),
        "sequences": None if s is None else {
            "attach": sequence_json(s.attach), "optimize": sequence_json(s.optimize),
            "unoptimize": sequence_json(s.unoptimize), "detach": sequence_json(s.detach)},
        "findings": [f.to_json() for f in site.findings],
    }


def plan_json(plan: Plan) -> dict[str, Any]:
    return {
        **envelope(PLAN_SCHEMA, PLAN_SCHEMA_VERSION, tool="text"), "path": plan.path,
        "elf": {"class": 64 if plan.is64 else 32, "type": plan.elf_type},
        "protocol": plan.protocol, "experimental": False,
        "load_base": plan.load_base, "load_base_source": plan.load_base_source,
        "trampoline_source": plan.trampoline_source,
        "trampolines": list(plan.trampolines),
        "sites": [site_json(s) for s in plan.sites],
        "findings": [f.to_json() for f in plan.findings],
    }


# -- text ------------------------------------------------------------------------------------

def _state_line(state: bytes, address: int, note: str) -> str:
    text = describe(state, address, 1)
    if state[0] == 0xCC:
        text = "int3 (trap)"
    return f"    {state.hex(' '):<30} {text:<34} {note}".rstrip()


def sequence_lines(seq: Sequence) -> list[str]:
    lines = [f"  {seq.name}:", _state_line(seq.start, seq.address, "")]
    for i, st in enumerate(seq.steps, 1):
        check = "" if st.expect_byte0 is None else f", checks byte 0 == {st.expect_byte0:02x}"
        note = (f"<- step {i}: +{st.offset} := {st.data.hex(' ')} ({st.what}{check}"
                f"{', serialize' if st.serialize else ''})")
        lines.append(_state_line(st.after, seq.address, note))
    return lines


def site_lines(site: SitePlan) -> list[str]:
    """One site of `usdtpatch plan`'s text, line by line."""
    s = site.sequences
    head = f"{site.probe} at {site.address:#x}"
    if site.file_offset is not None:
        head += f" (file offset {site.file_offset:#x})"
    head += f": {site.form}"
    if s is None:
        lines = [head + ", cannot be probed"]
    else:
        if s.trampoline is not None and s.optimize is not None:
            call_end = s.address + len(s.original)
            head += (f", {s.protocol} protocol, trampoline {s.trampoline:#x} "
                     f"(rel32 {s.trampoline - call_end:+#x})")
        else:
            head += ", int3 only"
        if site.guarded:
            head += ", red-zone guarded"
        lines = [head]
        if s.optimize is not None and s.unoptimize is not None:
            lines += sequence_lines(s.optimize) + sequence_lines(s.unoptimize)
        else:
            lines += sequence_lines(s.attach) + sequence_lines(s.detach)
    for f in site.findings:
        lines.append(f"  {f.severity.value} [{f.code}] {f.message}" +
                     (f" ({f.hint})" if f.hint else ""))
    return lines


def plan_text(plan: Plan) -> str:
    """`usdtpatch plan`'s text."""
    gen = plan.generation
    proto = f"{gen.name} protocol (Linux {', '.join(gen.examples)})"
    tr = ", ".join(f"{t:#x}" for t in plan.trampolines) or "none"
    lines = [f"{plan.path}: {len(plan.sites)} site(s), {proto}, load base "
             f"{plan.load_base:#x} ({plan.load_base_source}), trampoline {tr} "
             f"(from {plan.trampoline_source})"]
    for f in plan.findings:
        lines.append(f"{f.severity.value} [{f.code}] {f.message}")
    for site in plan.sites:
        lines += site_lines(site)
    return "\n".join(lines) + "\n"
