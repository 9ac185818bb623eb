"""The protocol lab: kernel write protocols as data files (TOML), turned into the sequences
`usdtpatch verify` runs through the emulator's torn states (`verify --protocol FILE`).

A protocol file (docs/kcheck.md, "Protocol files"; the shipped ones are nop5.toml, the nop5
generation's protocol (6.18), and nop10.toml, the nop10 generation's (7.3); wrong/*.toml are
wrong on purpose, one way each):

    name = "nop5"
    model = "nop5"        # the generation modelled: nop5 or nop10 (kernelfacts.GENERATIONS)
    [states]              # the site's states as AT&T assembly, assembled at the site
    original = "{site}"   #   {site} / {site[a:b]}: the site's own bytes (as .byte)
    int3 = "int3; {site[1:5]}"
    call = "call {trampoline}"   # {trampoline}, {trampoline+N}: the trampoline address
    [sequences.optimize]  # attach, detach, optimize, unoptimize
    start = "original"
    steps = [{ write = "int3[0:1]", expect = "original[0]", what = "int3 at byte 0" }, ...]

A step writes bytes a..b of a state's encoding at offset a; `expect` is the byte 0 the kernel
checks before writing (a state's byte, or omitted). The model's sites (those `plan` gives the
model's sequences) get the file's sequences; the others keep theirs.

keystone-engine assembles each statement of a state separately, at its address in the site;
capstone (usdtpatch.x86.decode) decodes the encoding back, and a statement whose bytes do not
say what its text says is refused with the difference shown: a different instruction, a
displacement written in the text (even 0x0) and missing from the encoding, a `nop` that is not
a NOP the CPU and the kernel decode as one (keystone encodes `nopl 0x0(%rax,%rax,1)` as
`0f 18 24 00`, a 4-byte prefetch-space hint, not the 5-byte `0f 1f 44 00 00`), or a state
whose length is not the site's.

Deferred import: keystone, only when a state is assembled (loading a protocol file does not
assemble).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from usdtpatch.errors import InputError
from usdtpatch.kernelfacts import OPTIMIZING
from usdtpatch.sequences.plan import Plan
from usdtpatch.sequences.sequences import (
    SiteSequences,
    build_sequence,
    protocol_generation,
)
from usdtpatch.x86.decode import disassemble
from usdtpatch.x86.nops import decode_nop

SEQUENCE_NAMES = ("attach", "detach", "optimize", "unoptimize")
_SLICE = re.compile(r"^(?P<name>[A-Za-z_][\w-]*)\[(?P<a>\d+)(?::(?P<b>\d+))?\]$")
_PLACEHOLDER = re.compile(r"\{(?P<body>[^{}]*)\}")
_TRAMP = re.compile(r"^trampoline\s*(?:(?P<sign>[+-])\s*(?P<n>0x[0-9a-fA-F]+|\d+))?$")


class ProtocolError(InputError):
    """A protocol file that cannot be used (one line, naming the file)."""


@dataclass(frozen=True, slots=True)
class StepSpec:
    state: str
    start: int
    end: int
    expect: tuple[str, int] | None  # (state, byte index)
    what: str


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    name: str
    start: str
    steps: tuple[StepSpec, ...]


@dataclass(frozen=True, slots=True)
class Protocol:
    path: str
    name: str
    model: str  # the name of the generation modelled (nop5 | nop10)
    description: str
    states: dict[str, str]  # name -> assembly text
    sequences: dict[str, SequenceSpec]

    @property
    def length(self) -> int:
        gen = protocol_generation(self.model)
        assert gen is not None, f"a protocol of model {self.model!r}"
        return gen.nop_length


def shipped(name: str) -> Path:
    """The path of a protocol file shipped with usdtpatch (e.g. "nop5", "wrong/wrong-rel32")."""
    return Path(str(resources.files("usdtpatch.sequences.protocols").joinpath(f"{name}.toml")))


# ------------------------------------------------------------------------------ loading


def _slice(path: str, text: str, where: str) -> tuple[str, int, int]:
    m = _SLICE.match(text.strip())
    if m is None:
        raise ProtocolError(f"{path}: {where}: {text!r} is not STATE[a:b] or STATE[i]")
    a = int(m["a"])
    b = int(m["b"]) if m["b"] is not None else a + 1
    if b <= a:
        raise ProtocolError(f"{path}: {where}: empty byte range {text!r}")
    return m["name"], a, b


def load_protocol(path: str | Path) -> Protocol:
    src = str(path)
    try:
        with open(src, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError as exc:
        raise ProtocolError(f"{src}: no such file") from exc
    except OSError as exc:
        raise ProtocolError(f"{src}: cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProtocolError(f"{src}: not a TOML protocol file: {exc}") from exc
    name = doc.get("name")
    model = doc.get("model")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{src}: missing name = \"...\"")
    if not isinstance(model, str) or protocol_generation(model) is None:
        names = " or ".join(f'"{g.name}"' for g in OPTIMIZING)
        raise ProtocolError(f"{src}: model must be {names}, found {model!r}")
    states = doc.get("states")
    if not isinstance(states, dict) or not states or \
            not all(isinstance(v, str) for v in states.values()):
        raise ProtocolError(f"{src}: [states] must map names to assembly text")
    seqs_doc = doc.get("sequences")
    if not isinstance(seqs_doc, dict):
        raise ProtocolError(f"{src}: missing [sequences]")
    unknown = set(seqs_doc) - set(SEQUENCE_NAMES)
    if unknown:
        raise ProtocolError(f"{src}: unknown sequence(s) {', '.join(sorted(unknown))} "
                            f"(expected {', '.join(SEQUENCE_NAMES)})")
    for required in ("attach", "detach"):
        if required not in seqs_doc:
            raise ProtocolError(f"{src}: [sequences.{required}] is required")
    if ("optimize" in seqs_doc) != ("unoptimize" in seqs_doc):
        raise ProtocolError(f"{src}: give both optimize and unoptimize, or neither")
    sequences: dict[str, SequenceSpec] = {}
    for sname, sd in seqs_doc.items():
        where = f"sequences.{sname}"
        if not isinstance(sd, dict) or not isinstance(sd.get("start"), str) \
                or not isinstance(sd.get("steps"), list):
            raise ProtocolError(f"{src}: {where}: needs start = \"STATE\" and steps = [...]")
        if sd["start"] not in states:
            raise ProtocolError(f"{src}: {where}.start: no state {sd['start']!r}")
        steps = []
        for i, st in enumerate(sd["steps"]):
            w = f"{where}.steps[{i}]"
            if not isinstance(st, dict) or not isinstance(st.get("write"), str):
                raise ProtocolError(f"{src}: {w}: needs write = \"STATE[a:b]\"")
            state, a, b = _slice(src, st["write"], f"{w}.write")
            if state not in states:
                raise ProtocolError(f"{src}: {w}.write: no state {state!r}")
            expect = None
            if "expect" in st:
                if not isinstance(st["expect"], str):
                    raise ProtocolError(f"{src}: {w}.expect: expected \"STATE[i]\"")
                es, ea, eb = _slice(src, st["expect"], f"{w}.expect")
                if es not in states or eb != ea + 1:
                    raise ProtocolError(f"{src}: {w}.expect: {st['expect']!r} is not one byte "
                                        f"of a state")
                expect = (es, ea)
            steps.append(StepSpec(state=state, start=a, end=b, expect=expect,
                                  what=str(st.get("what", ""))))
        sequences[sname] = SequenceSpec(sname, sd["start"], tuple(steps))
    return Protocol(path=src, name=name, model=model, description=str(doc.get("description", "")),
                    states=dict(states), sequences=sequences)


# ------------------------------------------------------------------------------ assembling


def _substitute(proto: Protocol, state: str, text: str, site: bytes, trampoline: int | None
                ) -> str:
    def one(m: re.Match[str]) -> str:
        body = m["body"].strip()
        t = _TRAMP.match(body)
        if t is not None:
            if trampoline is None:
                raise ProtocolError(f"{proto.path}: state {state}: {{trampoline}} for a site "
                                    f"without a trampoline")
            n = int(t["n"], 0) if t["n"] else 0
            return hex(trampoline + (n if t["sign"] != "-" else -n))
        if body == "site":
            chunk = site
        else:
            sm = _SLICE.match(body)
            if sm is None or sm["name"] != "site":
                raise ProtocolError(f"{proto.path}: state {state}: unknown placeholder "
                                    f"{{{body}}} (expected site, site[a:b], trampoline)")
            a = int(sm["a"])
            b = int(sm["b"]) if sm["b"] is not None else a + 1
            chunk = site[a:b]
        return ".byte " + ", ".join(f"0x{x:02x}" for x in chunk) if chunk else ""
    return _PLACEHOLDER.sub(one, text)


def _norm(text: str) -> str:
    t = text.lower().replace(" ", "")
    t = re.sub(r",1\)", ")", t)  # scale 1 is the default
    t = re.sub(r"(?<![\w$])(?:0x0+|0)\(", "(", t)  # a zero displacement, once checked
    t = re.sub(r"0x[0-9a-f]+|(?<![\w%])\d+", lambda m: hex(int(m[0], 0)), t)
    return t


def _mnemonic_ok(text_mn: str, got_mn: str) -> bool:
    return got_mn == text_mn or (got_mn[:-1] == text_mn and got_mn[-1] in "bwlq") or \
        (text_mn[:-1] == got_mn and text_mn[-1] in "bwlq")


def _nop_mod(code: bytes) -> int | None:
    """ModRM.mod of a `0f 1f /r` NOP (None for 90 or anything else)."""
    i = 0
    while i < len(code) and code[i] in _PREFIXES:
        i += 1
    if i < len(code) and 0x40 <= code[i] <= 0x4F:
        i += 1
    if code[i:i + 2] == b"\x0f\x1f" and i + 2 < len(code):
        return code[i + 2] >> 6
    return None


_PREFIXES = frozenset((0x66, 0x67, 0xF2, 0xF3, 0x2E, 0x3E, 0x26, 0x36, 0x64, 0x65, 0xF0))


def _check_statement(proto: Protocol, state: str, stmt: str, code: bytes, address: int
                     ) -> None:
    """Refuse an instruction whose bytes do not say what its text says."""
    insns = disassemble(code, address)
    decoded = "; ".join(i.text for i in insns) or "nothing"
    why: list[str] = []
    if len(insns) != 1 or insns[0].size != len(code):
        why.append(f"capstone decodes {len(insns)} instruction(s)")
    else:
        got = insns[0]
        text_mn, _, text_ops = stmt.strip().partition(" ")
        if not _mnemonic_ok(text_mn.lower(), got.mnemonic) or \
                _norm(text_ops) != _norm(got.op_str):
            why.append("a different instruction")
        if text_mn.lower().startswith("nop"):
            nop = decode_nop(code)
            if nop is None:
                why.append(f"{code[:2].hex(' ')} is not a NOP opcode (90, 0f 1f /0) but a hint "
                           f"in the prefetch/NOP space, which the kernel does not take for a NOP")
            elif nop.hint:
                why.append("a hint NOP (0f 1f with ModRM.reg != 0), which the kernel "
                           "single-steps")
            elif re.search(r"(?<![\w$])(?:0x[0-9a-fA-F]+|\d+)\(", text_ops) and \
                    _nop_mod(code) == 0:
                why.append("the displacement written in the text is not in the encoding")
    if why:
        raise ProtocolError(f"{proto.path}: state {state}: `{stmt}` assembles to "
                            f"{code.hex(' ')} ({len(code)} bytes), which capstone reads as "
                            f"`{decoded}`: not what the text says: {'; '.join(why)}")


def assemble_state(proto: Protocol, state: str, address: int, site: bytes,
                   trampoline: int | None) -> bytes:
    """The bytes of `state` at `address` for a site whose own bytes are `site`."""
    import keystone

    text = _substitute(proto, state, proto.states[state], site, trampoline)
    ks = keystone.Ks(keystone.KS_ARCH_X86, keystone.KS_MODE_64)
    ks.syntax = keystone.KS_OPT_SYNTAX_ATT
    out = b""
    for stmt in (s.strip() for s in re.split(r"[;\n]", text)):
        if not stmt:
            continue
        try:
            enc, _ = ks.asm(stmt, address + len(out))
        except keystone.KsError as exc:
            raise ProtocolError(f"{proto.path}: state {state}: cannot assemble `{stmt}`: "
                                f"{exc}") from exc
        code = bytes(enc or b"")
        if not code:
            raise ProtocolError(f"{proto.path}: state {state}: `{stmt}` assembles to nothing")
        if not stmt.startswith("."):
            _check_statement(proto, state, stmt, code, address + len(out))
        out += code
    if len(out) != len(site):
        raise ProtocolError(f"{proto.path}: state {state}: `{proto.states[state]}` is "
                            f"{len(out)} bytes ({out.hex(' ')}), the site is {len(site)} "
                            f"({site.hex(' ')})")
    return out


def site_sequences(proto: Protocol, address: int, original: bytes,
                   trampoline: int | None) -> SiteSequences:
    """The protocol's sequences for one site."""
    encoded = {name: assemble_state(proto, name, address, original, trampoline)
               for name in proto.states}
    seqs = {}
    for sname, spec in proto.sequences.items():
        writes = []
        for st in spec.steps:
            data = encoded[st.state][st.start:st.end]
            if len(data) != st.end - st.start:
                raise ProtocolError(f"{proto.path}: sequences.{sname}: {st.state}[{st.start}:"
                                    f"{st.end}] leaves the {len(original)}-byte site")
            expect = None if st.expect is None else encoded[st.expect[0]][st.expect[1]]
            writes.append((st.start, data, expect, st.what))
        try:
            seqs[sname] = build_sequence(sname, address, encoded[spec.start], writes)
        except ValueError as exc:
            raise ProtocolError(f"{proto.path}: sequences.{sname}: {exc}") from exc
    return SiteSequences(protocol=proto.model, address=address, original=original,
                         trampoline=trampoline, attach=seqs["attach"], detach=seqs["detach"],
                         optimize=seqs.get("optimize"), unoptimize=seqs.get("unoptimize"))


def apply_protocol(plan: Plan, proto: Protocol) -> Plan:
    """`plan` (made for the protocol's model) with the protocol's sequences on every site the
    model optimizes; the other sites keep their plan."""
    if plan.protocol != proto.model:
        raise ProtocolError(f"{proto.path}: a {proto.model} protocol, the plan is {plan.protocol}")
    sites = []
    for s in plan.sites:
        q = s.sequences
        if q is not None and q.protocol == proto.model and q.optimize is not None:
            sites.append(replace(s, sequences=site_sequences(proto, q.address, q.original,
                                                             q.trampoline)))
        else:
            sites.append(s)
    return replace(plan, sites=tuple(sites))


def describe(proto: Protocol) -> dict[str, Any]:
    return {"path": proto.path, "name": proto.name, "model": proto.model,
            "description": proto.description}
