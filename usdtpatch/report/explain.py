"""`usdtpatch explain`'s text: every registered finding code with its severity and title, or
one code's documentation (docs/findings.md's section, from the copy shipped in the package:
usdtpatch.findings.documentation), as `rustc --explain` prints it."""

from __future__ import annotations

from usdtpatch.findings import CODES, RENAMED, documentation, lookup


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
