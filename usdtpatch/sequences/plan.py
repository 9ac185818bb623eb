"""A plan: every probe site of a file with the kernel's write sequences for it, as data, and
read back from its versioned JSON form (schema `usdtpatch/plan`, version 1; documented in
docs/plan-verify.md; the document is made by usdtpatch/report/plan.py).

Which instruction the kernel probes for each site form (docs/plan-verify.md):
- nop5 / other accepted 5-byte NOP at the note pc: that instruction;
- combo5 (`90` + nop5): the nop5 at pc + 1 (libbpf 1.7 attaches there on kernels with the
  uprobe syscall);
- red-zone-guarded nop5 (`lea -0x80(%rsp),%rsp; nop5; lea 0x80(%rsp),%rsp` at the pc, the
  form `rewrite` writes, docs/rewrite.md): the nop5 at pc + 5, verified from pc to the end of
  the second lea;
- nop10 / combo10 under the nop10 generation's protocol: the nop10 (at pc, or pc + 1, where
  the libbpf of the 7.3 tree attaches);
- anything else: the instruction at the pc, int3 path only (attach/detach).

Trampolines: `--trampoline` fixes one for every site; otherwise sites are placed in address
order against the mappings (from maps, or laid out from the load base), each later site
reusing an earlier trampoline within reach, as the kernel does when sites are hit in that order.

Deferred imports: analysis/check.py (check: the red-zone verdict), only when a plan needs it
and was not given it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from usdtpatch.analysis.probes import ProbeSet, is_x86
from usdtpatch.analysis.rules import Outcome, rule
from usdtpatch.elf.image import ET_EXEC, ElfImage
from usdtpatch.errors import InputError, UnsupportedError
from usdtpatch.findings import (
    OPTIMIZED_CALL_CLOBBERS_RED_ZONE,
    RENAMED,
    RETIRED,
    SITE_TRUNCATED,
    SITE_UNMAPPED,
    Finding,
    Severity,
    is_registered,
)
from usdtpatch.kernelfacts import DEFAULT, OPTIMIZING, PAGE, Generation
from usdtpatch.sequences.sequences import (
    PROTOCOL_INT3,
    Sequence,
    SiteSequences,
    Step,
    int3_sequences,
    optimized_sequences,
    protocol_generation,
    refusal_finding,
    trampoline_reach,
)
from usdtpatch.sequences.trampoline import (
    TRAMPOLINE_NAME,
    MapEntry,
    check_load_base,
    default_load_base,
    layout_from_load_base,
    load_base_from_maps,
    place_trampoline,
)
from usdtpatch.version import __version__
from usdtpatch.x86.nops import (
    FORMS,
    GUARD_ENTER,
    GUARD_LEAVE,
    NOP5,
    SiteForm,
    decode_nop,
    is_guarded_nop5,
)

PLAN_SCHEMA = "usdtpatch/plan"
PLAN_SCHEMA_VERSION = 1

GUARDED_NOP5 = GUARD_ENTER + NOP5 + GUARD_LEAVE
_PROTOCOLS = " or ".join(g.name for g in OPTIMIZING)  # a plan's protocols, in an error


@dataclass(frozen=True, slots=True)
class SitePlan:
    """One probe's site: where a thread enters and leaves it, and the sequences (None when
    the kernel cannot probe it at all)."""

    probe: str  # provider:name
    index: int  # position among the file's notes
    link_address: int  # link-time address of the probed instruction
    address: int  # run-time address of the probed instruction
    file_offset: int | None
    entry: int  # run-time address where a thread arrives (the address, or the guard's lea)
    exit: int  # run-time address where it must end up
    guarded: bool  # red-zone guarded: nothing may be written in [rsp-128, rsp)
    form: str  # the site form as `list` names it, plus how the kernel site was chosen
    sequences: SiteSequences | None
    findings: tuple[Finding, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    path: str
    is64: bool
    elf_type: int
    protocol: str  # the name of the generation planned (nop5 | nop10)
    load_base: int
    load_base_source: str  # maps | option | default
    trampoline_source: str  # option | maps | layout
    sites: tuple[SitePlan, ...]
    findings: tuple[Finding, ...]

    @property
    def generation(self) -> Generation:
        gen = protocol_generation(self.protocol)
        assert gen is not None, f"a plan of protocol {self.protocol!r}"
        return gen

    @property
    def trampolines(self) -> tuple[int, ...]:
        return tuple(sorted({s.sequences.trampoline for s in self.sites
                             if s.sequences is not None and s.sequences.trampoline is not None}))


def _kernel_site(form: SiteForm, code: bytes, before: bytes, gen: Generation
                 ) -> tuple[int, int, bool, str]:
    """(offset from pc, length, guarded, description) of the instruction a consumer of `gen`
    probes.

    A guarded site has its pc on the nop5, between `lea -0x80(%rsp),%rsp` (the bytes
    `before` the pc) and `lea 0x80(%rsp),%rsp`: tracers attach to the NOP itself.
    """
    if is_guarded_nop5(before, code):
        return 0, len(NOP5), True, "guarded-nop5 (lea -0x80(%rsp) before, lea 0x80 after)"
    facts = FORMS[form]
    # the generation's own NOP is probed where its consumers attach: pc + 1 behind a `90`
    # (libbpf 1.7 for `90` + nop5 on ENXIO, the 7.3 tree's for `90` + nop10 on EPROTO);
    # anything else at the pc (combo5's `90` on the nop10 generation, measured on 7.3)
    if facts.nop_length and facts.nop_length == gen.nop_length:
        at, n = facts.nop_at, facts.nop_length
        return at, n, False, f"{form.value} (nop{n} at pc+{at})" if at else form.value
    insn = decode_nop(code[:15])
    length = insn.length if insn is not None else 1
    return 0, length, False, form.value


def red_zone_users(ps: ProbeSet) -> dict[int, str]:
    """`check`'s red-zone verdict (usdtpatch.analysis.check, which asks analysis/hazards.red_zone):
    for each probe (by note index) whose function may keep live data below %rsp at the site,
    the rule's reason. Plan and verify flag the optimized call's writes below rsp on these
    sites only, the sites where check reports red-zone-live: one verdict from one rule."""
    from usdtpatch.analysis.check import check

    if ps.notes is None or not ps.probes:
        return {}
    return {s.probe.index: s.red_zone.reason for s in check(ps).sites
            if s.red_zone is not None and s.red_zone.may_use}


def build_plan(ps: ProbeSet, path: str, protocol: str = DEFAULT.name, load_base: int = 0,
               load_base_source: str = "default", maps: tuple[MapEntry, ...] | None = None,
               trampoline: int | None = None, mmap_min_addr: int = PAGE,
               red_zone: Mapping[int, str] | None = None) -> Plan:
    """The plan for every probe of `ps` under `protocol`, loaded at `load_base`.

    `trampoline` fixes the trampoline of every site; else `maps` (a snapshot of the process)
    or, without it, the file laid out at `load_base` decides where the kernel puts it.
    `red_zone`: red_zone_users(ps), when the caller has it (else it is worked out here).
    """
    image = ps.image
    if not is_x86(image):
        raise UnsupportedError(f"{image.machine_name} code: plan handles x86 only")
    if not image.little_endian:
        raise UnsupportedError("big-endian x86 ELF: plan handles little-endian x86 only")
    gen = protocol_generation(protocol)
    if gen is None:
        raise InputError(f"unknown protocol {protocol!r}, expected {_PROTOCOLS}")
    if image.type == ET_EXEC:  # loaded at its link addresses: no base moves it
        load_base = 0
    findings: list[Finding] = []
    if trampoline is not None:
        tsource = "option"
        layout: tuple[MapEntry, ...] = ()
    elif maps is not None:
        tsource = "maps"
        layout = maps
    else:
        tsource = "layout"
        layout = layout_from_load_base(image, load_base, path)
    sites: list[SitePlan] = []
    # In address order: the kernel places a trampoline when a site is first optimized and a
    # later site within reach reuses it; planned in this order, each site sees the pages the
    # ones before it took (the layout grows below), as when they are hit in that order.
    order = sorted(ps.probes, key=lambda p: p.address)
    for probe in order:
        where = probe.probe_id
        if probe.offset is None or not probe.code:
            findings.append(SITE_UNMAPPED.finding(
                f"probe address {probe.address:#x} is in no loadable segment", where))
            continue
        # The kernel probes the NOP, which is not always at pc: a combo form's starts at pc+1,
        # and a guarded nop5 is wrapped in the leas of rewrite's red-zone guard (the one before
        # pc is read to tell), so its entry and exit are those of the whole guarded sequence.
        window = image.read_vaddr(probe.address, len(GUARDED_NOP5) + 16)
        before = image.read_vaddr(probe.address - len(GUARD_ENTER), len(GUARD_ENTER))
        off, length, guarded, desc = _kernel_site(probe.site.form, window, before, gen)
        code = window[off:]
        if len(code) < length:
            findings.append(SITE_TRUNCATED.finding(
                f"only {len(code)} bytes of the site are in the file", where))
            continue
        link = probe.address + off
        addr = link + load_base
        original = code[:length]
        entry = addr - len(GUARD_ENTER) if guarded else addr
        exit_ = entry + len(GUARDED_NOP5) if guarded else addr + length
        site_findings: list[Finding] = []
        call_end = gen.nop_length
        tramp = trampoline
        reused = False
        if tramp is None and gen.optimizes:
            placed = place_trampoline(layout, addr, call_end, mmap_min_addr)
            tramp, reused = placed.address, placed.reused
        # the rule engine's verdict (the one check asks), worded for the plan
        verdict = rule(gen, original, addr, is64=image.is64,
                       reach=trampoline_reach(addr, call_end, tramp))
        why = refusal_finding(verdict, addr, call_end, original, tramp, where)
        if verdict.outcome is Outcome.UNPROBEABLE:
            assert why is not None
            sites.append(SitePlan(probe=probe.probe_id, index=probe.index, link_address=link,
                                  address=addr, file_offset=probe.offset + off, entry=entry,
                                  exit=exit_, guarded=guarded, form=desc, sequences=None,
                                  findings=(why,)))
            continue
        if why is not None or not gen.optimizes:
            if why is not None:
                site_findings.append(why)
            seqs = int3_sequences(addr, original)
        else:
            assert tramp is not None
            seqs = optimized_sequences(gen, addr, original, tramp)
        # a new trampoline is a new mapping: the next sites reuse it or must fit around it
        if (seqs.trampoline is not None and trampoline is None and not reused):
            layout = (*layout, MapEntry(start=seqs.trampoline, end=seqs.trampoline + PAGE,
                                        perms="r-xp", offset=0, inode=0, path=TRAMPOLINE_NAME))
        # Only an optimized, unguarded site of a generation whose hit writes below rsp (nop5:
        # the call's return address and the trampoline's pushes) clobbers the red zone; a
        # guarded site moved rsp past the red zone first, and a site left to int3 never
        # calls. The red-zone analysis is asked once, lazily.
        if gen.red_zone_hazard and seqs.protocol == gen.name and not guarded:
            if red_zone is None:
                red_zone = red_zone_users(ps)
            reason = red_zone.get(probe.index)
            if reason is not None:  # check's red-zone-live site
                site_findings.append(OPTIMIZED_CALL_CLOBBERS_RED_ZONE.finding(
                    f"when optimized, the call and the trampoline's pushes write the "
                    f"{gen.writes_below_rsp} bytes "
                    f"below rsp on every hit (verify measures it), and the function may keep "
                    f"live data there: {reason}", where))
        sites.append(SitePlan(probe=probe.probe_id, index=probe.index, link_address=link,
                              address=addr, file_offset=probe.offset + off, entry=entry, exit=exit_,
                              guarded=guarded, form=desc, sequences=seqs,
                              findings=tuple(site_findings)))
    return Plan(path=path, is64=image.is64, elf_type=image.type, protocol=protocol,
                load_base=load_base, load_base_source=load_base_source, trampoline_source=tsource,
                sites=tuple(sites), findings=tuple(findings))


def plan_for(ps: ProbeSet, path: str, protocol: str = DEFAULT.name, *,
             load_base: int | None = None, maps: tuple[MapEntry, ...] | None = None,
             maps_source: str = "maps", trampoline: int | None = None,
             mmap_min_addr: int = 4096, red_zone: Mapping[int, str] | None = None) -> Plan:
    """build_plan with the load base found as `usdtpatch plan` finds it: `load_base` when
    given, else where `maps` (a process's mappings, named `maps_source` in the error) has the
    file's first segment, else the loader's default (0x555555554000 for PIE, 0 otherwise).
    Raises InputError when `maps` do not map the file or the load base does not fit it."""
    source = "option"
    if load_base is None and maps is not None:
        load_base = load_base_from_maps(ps.image, maps, path)
        source = "maps"
        if load_base is None:
            raise InputError(f"{path}: not mapped in {maps_source} (no mapping of the file's "
                             f"first segment)")
    if load_base is None:
        load_base = default_load_base(ps.image)
        source = "default"
    check_load_base(ps.image, load_base)
    return build_plan(ps, path, protocol, load_base, source, maps, trampoline, mmap_min_addr,
                      red_zone)


# -- reading a plan document back (documents are made in usdtpatch/report/plan.py) ------

class _Reader:
    """Typed access to a JSON document that names the path of every bad value."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, what: str) -> InputError:
        return InputError(f"{self.source}: {where}: {what}")

    def get(self, obj: Any, key: str, where: str) -> Any:
        if not isinstance(obj, dict):
            raise self.fail(where, f"expected an object, found {type(obj).__name__}")
        if key not in obj:
            raise self.fail(where, f"missing key {key!r}")
        return obj[key]

    def int_(self, obj: Any, key: str, where: str, optional: bool = False) -> int | None:
        v = self.get(obj, key, where)
        if v is None and optional:
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(f"{where}.{key}", f"expected an integer, found {v!r}")
        if not 0 <= v < 1 << 64:
            raise self.fail(f"{where}.{key}", f"{v} is not a 64-bit address or size")
        return v

    def hex_(self, obj: Any, key: str, where: str) -> bytes:
        v = self.get(obj, key, where)
        if not isinstance(v, str):
            raise self.fail(f"{where}.{key}", f"expected a hex string, found {v!r}")
        try:
            return bytes.fromhex(v)
        except ValueError as exc:
            raise self.fail(f"{where}.{key}", f"not hex: {v[:40]!r}") from exc

    def str_(self, obj: Any, key: str, where: str) -> str:
        v = self.get(obj, key, where)
        if not isinstance(v, str):
            raise self.fail(f"{where}.{key}", f"expected a string, found {v!r}")
        return v


def _sequence_from(r: _Reader, doc: Any, where: str) -> Sequence | None:
    if doc is None:
        return None
    name = r.str_(doc, "name", where)
    address = r.int_(doc, "address", where)
    assert address is not None
    start = r.hex_(doc, "start", where)
    raw_steps = r.get(doc, "steps", where)
    if not isinstance(raw_steps, list):
        raise r.fail(f"{where}.steps", "expected a list")
    steps = []
    for i, st in enumerate(raw_steps):
        w = f"{where}.steps[{i}]"
        offset = r.int_(st, "offset", w)
        assert offset is not None
        expect = r.int_(st, "expect_byte0", w, optional=True)
        if expect is not None and expect > 0xFF:
            raise r.fail(f"{w}.expect_byte0", f"{expect} is not a byte value")
        if isinstance(st, dict) and "address" in st and st["address"] != address + offset:
            raise r.fail(f"{w}.address", f"{st['address']!r} is not the sequence address "
                                         f"{address:#x} + offset {offset}")
        serialize = r.get(st, "serialize", w)
        if not isinstance(serialize, bool):
            raise r.fail(f"{w}.serialize", f"expected true or false, found {serialize!r}")
        steps.append(Step(offset=offset, data=r.hex_(st, "write", w),
                          before=r.hex_(st, "before", w), after=r.hex_(st, "after", w),
                          expect_byte0=expect, serialize=serialize,
                          what=str(st.get("what", "")) if isinstance(st, dict) else ""))
    return Sequence(name, address, start, tuple(steps))


def _findings_from(raw: Any, r: _Reader, where: str) -> tuple[Finding, ...]:
    out = []
    for i, f in enumerate(raw if isinstance(raw, list) else []):
        if isinstance(f, dict) and isinstance(f.get("code"), str):
            try:
                sev = Severity(f.get("severity", "info"))
            except ValueError:
                sev = Severity.INFO
            code = RENAMED.get(f["code"], f["code"])  # a plan written by an earlier version
            if code in RETIRED:
                continue
            if not is_registered(code):
                raise r.fail(f"{where}[{i}].code", f"unknown finding code {f['code']!r}")
            out.append(Finding(code=code, severity=sev, message=str(f.get("message", "")),
                               hint=str(f.get("hint", "")), where=str(f.get("where", ""))))
    return tuple(out)


def plan_from_json(doc: Any, source: str = "plan") -> Plan:
    """A Plan from its JSON document (ours or anyone's); a bad document raises InputError."""
    r = _Reader(source)
    schema = r.get(doc, "schema", "$")
    if schema != PLAN_SCHEMA:
        raise r.fail("$.schema", f"expected {PLAN_SCHEMA!r}, found {schema!r}")
    version = r.get(doc, "schema_version", "$")
    if version != PLAN_SCHEMA_VERSION:
        raise r.fail("$.schema_version", f"version {version!r} is not supported (this is "
                                         f"usdtpatch {__version__}, plan schema "
                                         f"{PLAN_SCHEMA_VERSION})")
    protocol = r.str_(doc, "protocol", "$")
    if protocol_generation(protocol) is None:
        raise r.fail("$.protocol", f"expected {_PROTOCOLS}, found {protocol!r}")
    elf = r.get(doc, "elf", "$")
    elfclass = r.int_(elf, "class", "$.elf")
    elf_type = r.int_(elf, "type", "$.elf")
    load_base = r.int_(doc, "load_base", "$")
    assert load_base is not None and elf_type is not None
    raw_sites = r.get(doc, "sites", "$")
    if not isinstance(raw_sites, list):
        raise r.fail("$.sites", "expected a list")
    sites = []
    for i, sd in enumerate(raw_sites):
        w = f"$.sites[{i}]"
        link = r.int_(sd, "link_address", w)
        addr = r.int_(sd, "address", w)
        entry = r.int_(sd, "entry", w)
        exit_ = r.int_(sd, "exit", w)
        assert link is not None and addr is not None and entry is not None and exit_ is not None
        guarded = r.get(sd, "guarded", w)
        if not isinstance(guarded, bool):
            raise r.fail(f"{w}.guarded", f"expected true or false, found {guarded!r}")
        seqs_doc = r.get(sd, "sequences", w)
        seqs: SiteSequences | None = None
        if seqs_doc is not None:
            sp = r.str_(sd, "protocol", w)
            if sp != PROTOCOL_INT3 and protocol_generation(sp) is None:
                raise r.fail(f"{w}.protocol", f"expected {_PROTOCOLS} or {PROTOCOL_INT3}, "
                                              f"found {sp!r}")
            original = r.hex_(sd, "original", w)
            if not original:
                raise r.fail(f"{w}.original", "empty")
            tramp = r.int_(sd, "trampoline", w, optional=True)
            attach = _sequence_from(r, r.get(seqs_doc, "attach", f"{w}.sequences"),
                                    f"{w}.sequences.attach")
            detach = _sequence_from(r, r.get(seqs_doc, "detach", f"{w}.sequences"),
                                    f"{w}.sequences.detach")
            if attach is None or detach is None:
                raise r.fail(f"{w}.sequences", "attach and detach are required")
            optimize = _sequence_from(r, seqs_doc.get("optimize"), f"{w}.sequences.optimize")
            unoptimize = _sequence_from(r, seqs_doc.get("unoptimize"),
                                        f"{w}.sequences.unoptimize")
            seqs = SiteSequences(protocol=sp, address=addr, original=original, trampoline=tramp,
                                 attach=attach, detach=detach, optimize=optimize,
                                 unoptimize=unoptimize)
        fo = r.int_(sd, "file_offset", w, optional=True)
        sites.append(SitePlan(probe=r.str_(sd, "probe", w), index=r.int_(sd, "index", w) or 0,
                              link_address=link, address=addr, file_offset=fo, entry=entry,
                              exit=exit_, guarded=guarded, form=str(sd.get("form", "")),
                              sequences=seqs,
                              findings=_findings_from(sd.get("findings"), r, f"{w}.findings")))
    return Plan(path=str(doc.get("path", "")), is64=elfclass == 64, elf_type=elf_type,
                protocol=protocol, load_base=load_base,
                load_base_source=str(doc.get("load_base_source", "")),
                trampoline_source=str(doc.get("trampoline_source", "")), sites=tuple(sites),
                findings=_findings_from(doc.get("findings"), r, "$.findings"))


def with_site(plan: Plan, index: int, site: SitePlan) -> Plan:
    """`plan` with its site number `index` replaced (used to build wrong plans)."""
    sites = list(plan.sites)
    sites[index] = site
    return replace(plan, sites=tuple(sites))


def check_plan_matches(plan: Plan, image: ElfImage) -> list[str]:
    """Differences between a plan's idea of the file and the file (empty when they agree)."""
    problems = []
    if plan.is64 != image.is64:
        problems.append(f"the plan is for an ELF{64 if plan.is64 else 32} file, the file is "
                        f"ELF{64 if image.is64 else 32}")
    if plan.elf_type != image.type:
        problems.append(f"the plan is for ELF type {plan.elf_type}, the file has {image.type}")
    return problems
