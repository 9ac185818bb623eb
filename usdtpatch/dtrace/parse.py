"""Parse DTrace provider definitions (`.d` files) into frozen dataclasses.

Reference: the D language's provider declarations as DTrace documents them (Solaris Dynamic
Tracing Guide, "Statically Defined Tracing for User Applications") and as projects write them
(PostgreSQL's src/backend/utils/probes.d, CPython's Include/pydtrace.d, QEMU's generated
trace-dtrace files):

    provider NAME {
        probe PROBE(TYPE [NAME], ...);      // 0 to 12 arguments; `(void)` means none
        ...
    };

Probe names use `__` where DTrace shows `-`. `#pragma D ...` lines are skipped, and so are
other preprocessor lines (`#define`, `#include`) unless the caller ran cpp first (`-C`), whose
`# LINE "FILE"` markers are followed so that errors name the original line. Top-level
`typedef`, `struct`, `union` and `enum` declarations are skipped.

A malformed file raises DScriptError with one line: `FILE:LINE:COL: what was expected, what was
found`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from usdtpatch.errors import InputError

MAX_ARGS = 12  # sys/sdt.h probes take 0 to 12 arguments

_C_TYPE_WORDS = frozenset(
    "void char short int long float double signed unsigned _Bool bool const volatile "
    "restrict struct union enum".split())
_SKIPPED_DECLS = frozenset({"typedef", "struct", "union", "enum"})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"(?:0[xX][0-9a-fA-F]+|[0-9]+)[uUlL]*")
_LINEMARKER = re.compile(r'#\s*(?:line\s+)?(\d+)(?:\s+"((?:[^"\\]|\\.)*)")?')
_PUNCT = "{}();,*[]"


class DScriptError(InputError):
    """A .d file this parser cannot read; the message is one line with its location."""


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "ident", "number", "punct", "eof"
    text: str
    file: str
    line: int
    col: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def shown(self) -> str:
        return "the end of the file" if self.kind == "eof" else f"'{self.text}'"


@dataclass(frozen=True, slots=True)
class ArgDecl:
    """One probe argument: its C type, and its name when the declaration gives one."""

    type: str  # tokens joined: "const char *", "unsigned long long", "struct foo *"
    name: str | None

    @property
    def text(self) -> str:
        if self.name is None:
            return self.type
        return f"{self.type}{self.name}" if self.type.endswith("*") else f"{self.type} {self.name}"


@dataclass(frozen=True, slots=True)
class ProbeDecl:
    name: str  # as written, e.g. "query__done"
    args: tuple[ArgDecl, ...]
    line: int

    @property
    def dtrace_name(self) -> str:
        """The name DTrace shows: `__` becomes `-`."""
        return self.name.replace("__", "-")


@dataclass(frozen=True, slots=True)
class Provider:
    name: str
    probes: tuple[ProbeDecl, ...]


@dataclass(frozen=True, slots=True)
class DScript:
    source: str  # the file name used in messages
    providers: tuple[Provider, ...]


def tokenize(text: str, source: str) -> list[Token]:
    """The tokens of a .d file, comments and preprocessor lines removed."""
    out: list[Token] = []
    file, line = source, 1
    i, n = 0, len(text)
    line_start = 0
    at_line_start = True
    while i < n:
        ch = text[i]
        col = i - line_start + 1
        if ch == "\n":
            i += 1
            line += 1
            line_start = i
            at_line_start = True
            continue
        if ch in " \t\r\f\v":
            i += 1
            continue
        if ch == "#" and at_line_start:  # a preprocessor line: skipped, line markers followed
            end = text.find("\n", i)
            end = n if end < 0 else end
            marker = _LINEMARKER.match(text, i, end)
            if marker:
                if marker.group(2) is not None:
                    file = marker.group(2)
                line = int(marker.group(1)) - 1  # the number of the line after the marker
            i = end
            continue
        at_line_start = False
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise DScriptError(f"{file}:{line}:{col}: unterminated /* comment")
            line += text.count("\n", i, end)
            if "\n" in text[i:end]:
                line_start = text.rfind("\n", i, end) + 1
            i = end + 2
            continue
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        m = _IDENT.match(text, i)
        if m:
            out.append(Token(kind="ident", text=m.group(), file=file, line=line, col=col))
            i = m.end()
            continue
        m = _NUMBER.match(text, i)
        if m:
            out.append(Token(kind="number", text=m.group(), file=file, line=line, col=col))
            i = m.end()
            continue
        if ch in _PUNCT:
            out.append(Token(kind="punct", text=ch, file=file, line=line, col=col))
            i += 1
            continue
        raise DScriptError(f"{file}:{line}:{col}: unexpected character {ch!r}")
    col = n - line_start + 1
    out.append(Token(kind="eof", text="", file=file, line=line, col=col))
    return out


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.toks = tokens
        self.pos = 0

    @property
    def tok(self) -> Token:
        return self.toks[self.pos]

    def take(self) -> Token:
        t = self.toks[self.pos]
        if t.kind != "eof":
            self.pos += 1
        return t

    def is_punct(self, text: str) -> bool:
        return self.tok.kind == "punct" and self.tok.text == text

    def expect_punct(self, text: str, context: str, after_previous: bool = False) -> Token:
        """Take `text` or raise; `after_previous` places the error just after the token before
        (where a missing ';' belongs) rather than on the next token, maybe lines later."""
        if not self.is_punct(text):
            where = self.tok.where
            if after_previous and self.pos:
                prev = self.toks[self.pos - 1]
                where = f"{prev.file}:{prev.line}:{prev.col + len(prev.text)}"
            raise DScriptError(f"{where}: expected '{text}' {context}, found "
                               f"{self.tok.shown()}")
        return self.take()

    def expect_ident(self, what: str) -> Token:
        if self.tok.kind != "ident":
            raise DScriptError(f"{self.tok.where}: expected {what}, found {self.tok.shown()}")
        return self.take()

    def parse(self, source: str) -> DScript:
        providers: list[Provider] = []
        seen: dict[str, Token] = {}
        while self.tok.kind != "eof":
            t = self.tok
            if t.kind == "ident" and t.text == "provider":
                prov = self.provider()
                if prov.name in seen:
                    raise DScriptError(f"{t.where}: provider '{prov.name}' is declared twice "
                                       f"(first at line {seen[prov.name].line})")
                seen[prov.name] = t
                providers.append(prov)
            elif t.kind == "ident" and t.text in _SKIPPED_DECLS:
                self.skip_declaration()
            elif self.is_punct(";"):
                self.take()
            else:
                raise DScriptError(f"{t.where}: expected 'provider', found {t.shown()}")
        if not providers:
            raise DScriptError(f"{source}: no provider declaration found")
        return DScript(source, tuple(providers))

    def skip_declaration(self) -> None:
        start = self.tok
        depth = 0
        while True:
            t = self.take()
            if t.kind == "eof":
                raise DScriptError(f"{start.where}: '{start.text}' declaration is not "
                                   f"terminated by ';'")
            if t.kind == "punct":
                if t.text == "{":
                    depth += 1
                elif t.text == "}":
                    depth -= 1
                elif t.text == ";" and depth <= 0:
                    return

    def provider(self) -> Provider:
        self.take()  # provider
        name = self.expect_ident("a provider name")
        self.expect_punct("{", f"after 'provider {name.text}'")
        probes: list[ProbeDecl] = []
        seen: dict[str, int] = {}
        while not self.is_punct("}"):
            t = self.tok
            if t.kind == "ident" and t.text == "probe":
                probe = self.probe(name.text)
                if probe.name in seen:
                    raise DScriptError(f"{t.where}: probe '{probe.name}' is declared twice in "
                                       f"provider '{name.text}' (first at line "
                                       f"{seen[probe.name]})")
                seen[probe.name] = probe.line
                probes.append(probe)
            elif self.is_punct(";"):
                self.take()
            else:
                raise DScriptError(f"{t.where}: expected 'probe' or '}}' in provider "
                                   f"'{name.text}', found {t.shown()}")
        self.take()  # }
        if self.is_punct(";"):
            self.take()
        return Provider(name.text, tuple(probes))

    def probe(self, provider: str) -> ProbeDecl:
        start = self.take()  # probe
        name = self.expect_ident("a probe name")
        self.expect_punct("(", f"after 'probe {name.text}'")
        args: list[ArgDecl] = []
        if not self.is_punct(")"):
            while True:
                args.append(self.argument(name.text))
                if self.is_punct(","):
                    self.take()
                    continue
                break
        self.expect_punct(")", f"to close the arguments of probe '{name.text}'")
        self.expect_punct(";", f"after probe '{name.text}'", after_previous=True)
        if len(args) == 1 and args[0].type == "void" and args[0].name is None:
            args = []
        elif any(a.type == "void" for a in args):
            raise DScriptError(f"{name.where}: probe '{name.text}' has a 'void' argument; "
                               f"write 'probe {name.text}()' or '(void)' for no arguments")
        if len(args) > MAX_ARGS:
            raise DScriptError(f"{name.where}: probe '{name.text}' of provider '{provider}' has "
                               f"{len(args)} arguments; sys/sdt.h probes take at most "
                               f"{MAX_ARGS}")
        return ProbeDecl(name.text, tuple(args), start.line)

    def argument(self, probe: str) -> ArgDecl:
        words: list[Token] = []
        while True:
            t = self.tok
            if t.kind == "ident" or (t.kind == "punct" and t.text == "*"):
                words.append(self.take())
            elif t.kind == "punct" and t.text == "[":
                words.append(self.take())
                if self.tok.kind == "number":
                    words.append(self.take())
                words.append(self.expect_punct("]", "to close an array argument"))
            else:
                break
        if not words:
            raise DScriptError(f"{self.tok.where}: expected an argument type in probe "
                               f"'{probe}', found {self.tok.shown()}")
        if words[0].kind != "ident":
            raise DScriptError(f"{words[0].where}: an argument of probe '{probe}' starts with "
                               f"'{words[0].text}', expected a type name")
        if not (self.is_punct(",") or self.is_punct(")")):
            raise DScriptError(f"{self.tok.where}: expected ',' or ')' after an argument of "
                               f"probe '{probe}', found {self.tok.shown()}")
        return _arg_decl(words)


def _arg_decl(words: list[Token]) -> ArgDecl:
    texts = [w.text for w in words]
    array: list[str] = []
    if "[" in texts:
        k = texts.index("[")
        texts, array = texts[:k], texts[k:]
    name: str | None = None
    last = texts[-1]
    if (len(texts) >= 2 and _IDENT.fullmatch(last) and last not in _C_TYPE_WORDS
            and texts[-2] not in ("struct", "union", "enum")):
        name = last
        texts = texts[:-1]
    ctype = " ".join(texts)
    ctype = re.sub(r"\s*\*", " *", ctype).replace("* *", "**").replace("* *", "**")
    if array:
        ctype += " " + "".join(array)
    return ArgDecl(ctype.strip(), name)


def parse_dscript(text: str, source: str) -> DScript:
    """Parse the text of a .d file (`source` names it in messages)."""
    return _Parser(tokenize(text, source)).parse(source)
