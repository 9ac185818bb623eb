"""`usdtpatch explain`'s text: every registered finding code with its severity and title, or
one code's documentation (docs/findings.md's section, from the copy shipped in the package:
usdtpatch.findings.documentation), as `rustc --explain` prints it.

Deferred imports: textwrap and prove/assumptions.py, only for `explain assumptions`."""

from __future__ import annotations

from usdtpatch.findings import CODES, RENAMED, documentation, lookup

ASSUMPTIONS_TOPIC = "assumptions"  # `usdtpatch explain assumptions`


def assumptions_text() -> str:
    """What a proved or emulated detour rests on besides the file's model: each assumption's
    name, what it says and the tests that hold it (prove/assumptions.py's registry, which
    docs/rewrite.md's "What is assumed" lists too), for the installed package's users."""
    import textwrap

    from usdtpatch.prove.assumptions import ASSUMPTIONS, PROVED

    def para(text: str, indent: str = "") -> list[str]:
        return textwrap.wrap(text, 88, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)

    lines = para(f"A detour proved or emulated behaves as its window ({PROVED}). That rests "
                 f"on the file's model (the ELF constructs usdtpatch reads, refusing by name "
                 f"those it does not) and on these assumptions, each held by the tests named "
                 f"(docs/rewrite.md, \"What is assumed\", in the sources, lists the same):")
    for a in ASSUMPTIONS:
        lines += ["", a.name, *para(a.says, "  "), *para(f"held by: {', '.join(a.tests)}", "  ")]
    return "\n".join(lines) + "\n"


def codes_text() -> str:
    """Every registered code, its severity and its title, one line each."""
    width = max(map(len, CODES))
    sev = max(len(c.severity_text) for c in CODES.values())
    return "".join(f"{c.code:<{width}}  {c.severity_text:<{sev}}  {c.title}\n"
                   for c in sorted(CODES.values(), key=lambda c: c.code))


def explanation(code: str) -> str:
    """The documentation of a registered `code` (or of the code an earlier name now is)."""
    text = ""
    renamed = RENAMED.get(code)
    if renamed is not None:
        text += f"{code} is the earlier name of {renamed}\n\n"
        code = renamed
    entry = lookup(code)
    doc = documentation(code)
    text += f"{code} ({entry.severity_text}): {entry.title}\n\n"
    if doc:
        return text + doc + "\n"
    return text + f"- hint: {entry.hint or 'none'}\n"  # the page is not shipped with it
