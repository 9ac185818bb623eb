"""The structure of a package tree as data, for tests/test_structure.py: every import between
its modules (also inside functions; the imports under `if TYPE_CHECKING:` aside: they never
run), the circles in that graph, which module makes a versioned document, and the names a
page of documentation gives for modules.

Each function takes the folder of the package (`usdtpatch/`, or a small fake tree in a test),
so that every check can be shown an input it must reject.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Import:
    source: str  # the importing module, dotted (usdtpatch.cli.cmd_list)
    target: str  # the module imported: a module of the tree (a package: its __init__)
    line: int


def modules(package: Path) -> dict[str, Path]:
    """Every module of the package folder by dotted name (a package by its own name)."""
    out: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (anywhere, but under `if TYPE_CHECKING:`)."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _type_checking_only(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        todo.extend(ast.iter_child_nodes(node))


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    base = ".".join(parts[:keep])
    return f"{base}.{node.module}" if node.module else base


def imports(package: Path) -> list[Import]:
    """Every import from one module of the package to another."""
    mods = modules(package)
    out: list[Import] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in _import_nodes(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = _base(name, is_package, node)
                for a in node.names:  # a submodule by name, else a name of the module
                    targets.append(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
            for t in dict.fromkeys(targets):
                if t in mods and t != name:
                    out.append(Import(name, t, node.lineno))
    return out


def folder(module: str) -> str:
    """The folder a module belongs to: usdtpatch.analysis for usdtpatch.analysis.check (and
    for the package itself); a module at the top (usdtpatch.api) is its own."""
    return ".".join(module.split(".")[:2])


def circles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        if a != b:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def file_edges(found: Iterable[Import]) -> set[tuple[str, str]]:
    return {(i.source, i.target) for i in found}


def folder_edges(found: Iterable[Import]) -> set[tuple[str, str]]:
    return {(folder(i.source), folder(i.target)) for i in found
            if folder(i.source) != folder(i.target)}


# ------------------------------------------------------------------------------ documents


def document_makers(package: Path, home: str) -> list[str]:
    """"module:line" of every dict display outside `home` (a dotted subpackage) with a
    "schema_version" or "$schema" key: a versioned document made there."""
    out = []
    for name, path in modules(package).items():
        if name == home or name.startswith(home + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Dict) and any(
                    isinstance(k, ast.Constant) and k.value in ("schema_version", "$schema")
                    for k in node.keys):
                out.append(f"{name}:{node.lineno}")
    return out


def finding_makers(package: Path, home: str) -> list[str]:
    """"module:line" of every construction of a Finding outside `home` (the registry's module)
    that bypasses the registry: a call of `Finding(...)` itself, or a `replace(..., hint=...)`
    / `replace(..., severity=...)` that changes what the registry gave."""
    out = []
    for name, path in modules(package).items():
        if name == home:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            called = fn.id if isinstance(fn, ast.Name) else \
                fn.attr if isinstance(fn, ast.Attribute) else ""
            if called == "Finding" or (called == "replace" and any(
                    k.arg in ("hint", "severity") for k in node.keywords)):
                out.append(f"{name}:{node.lineno}")
    return out


def dynamic_readers(package: Path, homes: tuple[str, ...]) -> list[str]:
    """"module:line" of every DT_* constant assigned and every use of the name PT_DYNAMIC
    outside `homes` (the module that reads the dynamic section, and the one that defines the
    segment types): the dynamic section is read, and its tags named, in one place."""
    out = []
    for name, path in modules(package).items():
        if name in homes:
            continue
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id.startswith("DT_") for t in targets):
                    out.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.Name | ast.alias) and \
                    (node.id if isinstance(node, ast.Name) else node.name) == "PT_DYNAMIC":
                out.append(f"{name}:{node.lineno}")
    return sorted(set(out))


# ------------------------------------------------------------------------------ the face


def public_names(path: Path) -> set[str]:
    """The names a module's `__all__` lists (a list or tuple display at its top)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def face_violations(package: Path, callers: tuple[str, ...] = ("cli", "integrate"),
                    open_folders: tuple[str, ...] = ("cli", "integrate", "report")) -> list[str]:
    """"module:line name" of every use, in the `callers` folders, of a part of the package
    that is not its face: the face is the package's and its api module's `__all__` (imported
    from either, or named as an attribute of api), and the `open_folders` (the callers' own
    code and the renderings). Every import counts, also inside functions and under `if
    TYPE_CHECKING:` (a type taken from an internal module is an internal name)."""
    mods = modules(package)
    top = package.name
    api = f"{top}.api"
    face = {top: public_names(mods[top]) if top in mods else set(),
            api: public_names(mods[api]) if api in mods else set()}
    opened = tuple(f"{top}.{f}" for f in open_folders)

    def allowed_module(m: str) -> bool:
        return m in (top, api) or any(m == o or m.startswith(o + ".") for o in opened)

    out: list[str] = []
    for name, path in mods.items():
        if not any(name == f"{top}.{c}" or name.startswith(f"{top}.{c}.") for c in callers):
            continue
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        api_names: set[str] = set()  # the local names bound to the api module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == top and not allowed_module(a.name):
                        out.append(f"{name}:{node.lineno} {a.name}")
                    elif a.name == api and a.asname:
                        api_names.add(a.asname)
            elif isinstance(node, ast.ImportFrom):
                base = _base(name, is_package, node)
                if base.split(".")[0] != top or (allowed_module(base) and base not in face):
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in mods:  # a module by name
                        if not allowed_module(sub):
                            out.append(f"{name}:{node.lineno} {sub}")
                        elif sub == api:
                            api_names.add(a.asname or a.name)
                    elif base not in face or a.name not in face[base]:
                        out.append(f"{name}:{node.lineno} {base}.{a.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in api_names and node.attr not in face[api]:
                out.append(f"{name}:{node.lineno} {api}.{node.attr}")
    return sorted(set(out), key=lambda s: (s.split(":")[0], int(s.split(":")[1].split()[0]),
                                           s))


# ------------------------------------------------------------------------------ records


_PARSED: dict[tuple[str, int], ast.Module] = {}


def _parsed(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once per version of the file."""
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _PARSED:
        _PARSED[key] = ast.parse(path.read_text(), str(path))
    return _PARSED[key]


def record_classes(package: Path) -> set[str]:
    """The names of the package's dataclasses (a class decorated with `dataclass`, called or
    not, by any spelling: dataclass, dataclasses.dataclass)."""
    out: set[str] = set()
    for path in modules(package).values():
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.ClassDef) and any(
                    _called_name(d.func if isinstance(d, ast.Call) else d) == "dataclass"
                    for d in node.decorator_list):
                out.add(node.name)
    return out


def _called_name(fn: ast.expr) -> str:
    return fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) \
        else ""


def positional_records(package: Path, limit: int = 5) -> list[str]:
    """"module:line Class" of every call of one of the package's dataclasses with `limit` or
    more positional arguments (a record built by position: one field moved and every such
    call is silently wrong)."""
    records = record_classes(package)
    out = []
    for name, path in modules(package).items():
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.Call) and _called_name(node.func) in records and \
                    len(node.args) >= limit:
                out.append(f"{name}:{node.lineno} {_called_name(node.func)}")
    return out


# ------------------------------------------------------------------------ the names a page gives

_CODE = re.compile(r"`([^`\s]+)`")
_DOTTED = re.compile(r"^[a-z_][a-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _defined(path: Path) -> set[str]:
    """The names a module defines at its top (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def missing_names(page: str, package: Path) -> list[str]:
    """The module paths (`analysis/check.py`, `report/`) and dotted names (`elf.validate.
    validate_output`, `usdtpatch.api`) in backticks on `page` that name nothing in the
    package folder (or, for a path, in the folder above it: `tests/golden/`)."""
    mods = modules(package)
    top = package.name
    folders = {p.split(".")[1] for p in mods if "." in p}
    out = []
    for token in dict.fromkeys(t.rstrip(".,:;") for t in _CODE.findall(page)):
        if token.endswith(".py") or ("/" in token and token.endswith("/")):
            rel = token.removeprefix(f"{top}/")
            if not ((package / rel).exists() or (package.parent / token).exists()):
                out.append(token)
        elif _DOTTED.match(token) and token.split(".")[0] in folders | {top}:
            dotted = token if token.startswith(f"{top}.") else f"{top}.{token}"
            if not _resolves(dotted, mods):
                out.append(token)
    return out


def _resolves(dotted: str, mods: dict[str, Path]) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        if name in mods:
            rest = parts[cut:]
            return not rest or rest[0] in _defined(mods[name])
    return False


# ---------------------------------------------------------------------------------- the layers

_LAYER_ROW = re.compile(r"^\|\s*(\d+)\s*\|.*\|([^|]*)\|\s*$")


def parse_layers(page: str) -> list[list[str]]:
    """The layers of a page's table whose rows are `| N | what | the folders and modules |`
    (top first): the names in backticks of the last column (`cli/`, `api.py`)."""
    rows = []
    for line in page.splitlines():
        m = _LAYER_ROW.match(line.strip())
        if m:
            rows.append((int(m.group(1)), _CODE.findall(m.group(2))))
    return [names for _, names in sorted(rows)]


def place(module: str, folders: set[str]) -> str:
    """How a layer table names the place of `module`: its folder (`cli/`; `folders` are the
    package's subpackages), else the top module's file (`api.py`; the package itself is
    `__init__.py`)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return f"{parts[1]}/" if parts[1] in folders else f"{parts[1]}.py"


def layer_problems(package: Path, layers: list[list[str]]) -> list[str]:
    """Every module no layer names, and every import from a layer to one above it."""
    mods = modules(package)
    folders = {name.split(".")[1] for name, path in mods.items()
               if path.name == "__init__.py" and "." in name}
    rank = {name: i for i, names in enumerate(layers) for name in names}
    out = [f"{m}: in no layer (as {place(m, folders)})" for m in mods
           if place(m, folders) not in rank]
    for i in imports(package):
        a, b = rank.get(place(i.source, folders)), rank.get(place(i.target, folders))
        if a is not None and b is not None and b < a:
            out.append(f"{i.source}:{i.line} imports {i.target}, a layer above it")
    return out


# -------------------------------------------------------------------------- third-party engines

def third_party(package: Path) -> dict[str, set[str]]:
    """Each package outside the standard library and the tree that a module imports (every
    import that can run), with the modules that import it."""
    import sys

    out: dict[str, set[str]] = {}
    for name, path in modules(package).items():
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            tops = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""])
            for top in (t.split(".")[0] for t in tops):
                if top and top != package.name and top not in sys.stdlib_module_names:
                    out.setdefault(top, set()).add(name)
    return out


_ENGINE_ROW = re.compile(r"^\|\s*`([A-Za-z0-9_]+)`\s*\([^|)]*\)\s*\|.*\|([^|]*)\|\s*$")


def parse_engines(page: str) -> dict[str, set[str]]:
    """A page's engine table, rows `| `import name` (...) | role | `the module` |`: each
    engine with the module(s) its last column names (`x86/decode.py`, a package as `dir/`)."""
    out: dict[str, set[str]] = {}
    for line in page.splitlines():
        m = _ENGINE_ROW.match(line.strip())
        homes = _CODE.findall(m.group(2)) if m else []
        if m and homes and all(h.endswith((".py", "/")) for h in homes):
            out[m.group(1)] = set(homes)
    return out


def engine_homes(package: Path) -> dict[str, set[str]]:
    """third_party's answer with each module written as a page writes it (`x86/decode.py`,
    a package as its folder: `sequences/protocols/`)."""
    mods = modules(package)

    def written(name: str) -> str:
        rel = mods[name].relative_to(package)
        return f"{rel.parent.as_posix()}/" if rel.name == "__init__.py" else rel.as_posix()

    return {engine: {written(m) for m in users}
            for engine, users in third_party(package).items()}


# ---------------------------------------------------------------------------- private names

def private_uses(tests: Path, top: str) -> set[str]:
    """"module.name" for every private name (one leading underscore) of the package `top`
    that a test file takes: imported by name, or read as an attribute of a module of the
    package it imported."""
    out: set[str] = set()
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}  # a local name -> the package module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == top:
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        out.add(f"{node.module}.{a.name}")
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == top:
                        bound[a.asname or a.name] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                out.add(f"{bound[node.value.id]}.{node.attr}")
    return out


# ------------------------------------------------------------------- the types and the documents

def table_rows(page: str, header: tuple[str, ...]) -> list[list[str]]:
    """The cells of every row of a page's table whose header row begins with the cells
    `header` (`| type | module | ...`); the separator row left out."""
    rows: list[list[str]] = []
    inside = False
    for raw in page.splitlines():
        line = raw.strip()
        if not line.startswith("|"):
            inside = False
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if tuple(cells[:len(header)]) == header:
            inside = True
        elif inside and not set(line) <= set("|-: "):
            rows.append(cells)
    return rows


def _made(path: Path) -> set[str]:
    """The classes a module defines and the names it assigns at its top (not those it
    imports: a type is made where the page says, not passed through)."""
    names: set[str] = set()
    for node in _parsed(path).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def misplaced_types(page: str, package: Path) -> list[str]:
    """"Type (module)" for each type the page's types table (`| type | module | what |`)
    names in its first column that no module of its second column (`elf/image.py`, a
    package as `forkguard/`) defines: a type renamed, moved or gone."""
    out = []
    for cells in table_rows(page, ("type", "module")):
        homes = _CODE.findall(cells[1])
        made: set[str] = set()
        for home in homes:
            path = package / home
            files = sorted(path.rglob("*.py")) if home.endswith("/") else [path]
            for f in files:
                if f.is_file():
                    made |= _made(f)
        out += [f"{name} ({', '.join(homes)})" for name in _CODE.findall(cells[0])
                if name not in made]
    return out


def _strings(path: Path) -> dict[str, str]:
    """The names a module assigns a string at its top, with the string."""
    out: dict[str, str] = {}
    for node in _parsed(path).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str):
            out.update((t.id, node.value.value) for t in node.targets if isinstance(t, ast.Name))
    return out


def document_homes(package: Path, maker: str = "envelope") -> dict[str, set[str]]:
    """Each versioned document's schema with the modules that make it (written as a page
    writes them: `report/plan.py`): every call of `maker` (`envelope(SCHEMA, ...)`) whose
    first argument is a string, or a name assigned one at the top of the calling module or
    of the module of the package it is imported from."""
    mods = modules(package)
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        known = _strings(path)
        for top in _parsed(path).body:
            if isinstance(top, ast.ImportFrom):
                base = _base(name, path.name == "__init__.py", top)
                if base in mods:
                    theirs = _strings(mods[base])
                    known.update((a.asname or a.name, theirs[a.name]) for a in top.names
                                 if a.name in theirs)
        for node in ast.walk(_parsed(path)):
            if not (isinstance(node, ast.Call) and _called_name(node.func) == maker
                    and node.args):
                continue
            first = node.args[0]
            schema = first.value if isinstance(first, ast.Constant) else \
                known.get(first.id) if isinstance(first, ast.Name) else None
            if isinstance(schema, str):
                out.setdefault(schema, set()).add(path.relative_to(package).as_posix())
    return out


def parse_documents(page: str) -> dict[str, set[str]]:
    """A page's documents table (`| document (schema) | made by | page |`): each schema (the
    first name in backticks of a row) with the module that makes it (the first of the
    second column; `(read back by ...)` after it is not a maker)."""
    out: dict[str, set[str]] = {}
    for cells in table_rows(page, ("document (schema)", "made by")):
        schema, made_by = _CODE.findall(cells[0]), _CODE.findall(cells[1])
        if schema and made_by:
            out.setdefault(schema[0], set()).add(made_by[0])
    return out


# ------------------------------------------------------------------------------- the face, named

_LEADING_NAME = re.compile(r"[A-Za-z_]\w*")


def unnamed_functions(text: str, module: Path) -> list[str]:
    """The functions of a module's face (the lowercase names of its `__all__`) that `text`
    does not name in backticks (`load`, or with arguments: `load(mapped=True)`)."""
    named = {m.group() for m in map(_LEADING_NAME.match, _CODE.findall(text)) if m}
    return sorted(n for n in public_names(module) if n[:1].islower() and n not in named)


_LINK = re.compile(r"\]\(([^)#]+)")


def undocumented_documents(page: str, docs: Path) -> list[str]:
    """"schema (page.md)" for each row of a page's documents table whose linked page (third
    column, in the folder `docs`) does not name its schema (`p/plan` or "p/plan")."""
    out = []
    for cells in table_rows(page, ("document (schema)", "made by")):
        schema = _CODE.findall(cells[0])
        for link in _LINK.findall(cells[2]) if schema and len(cells) > 2 else []:
            path = docs / link
            text = path.read_text() if path.is_file() else ""
            if f"`{schema[0]}`" not in text and f'"{schema[0]}"' not in text:
                out.append(f"{schema[0]} ({link})")
    return out


# ----------------------------------------------------------------------------- outputs written

_PATH_WRITERS = {"write_text", "write_bytes", "savefig"}  # methods that write a file by path
_OS_WRITERS = {("os", "rename"), ("os", "replace"), ("os", "link")}
_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT"}


def file_writers(package: Path, home: str) -> set[str]:
    """"module how" for every way a module other than `home` (the one writer, io.py) puts
    bytes in a file by its path: `.write_text`, `.write_bytes`, `.savefig`, `open` with a
    writing mode, `os.open` with a writing flag, `os.rename`/`replace`/`link`, and shutil's
    copies and moves."""
    out: set[str] = set()
    for name, path in modules(package).items():
        if name == home:
            continue
        for node in ast.walk(_parsed(path)):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            owner = fn.value.id if isinstance(fn, ast.Attribute) and \
                isinstance(fn.value, ast.Name) else ""
            called = _called_name(fn)
            how = ""
            if isinstance(fn, ast.Attribute) and called in _PATH_WRITERS:
                how = f".{called}"
            elif (owner, called) in _OS_WRITERS or (
                    owner == "shutil" and ("copy" in called or called == "move")):
                how = f"{owner}.{called}"
            elif owner == "os" and called == "open" and len(node.args) > 1 and any(
                    _called_name(n) in _WRITE_FLAGS for n in ast.walk(node.args[1])
                    if isinstance(n, ast.Name | ast.Attribute)):
                how = "os.open"
            elif isinstance(fn, ast.Name) and called == "open":
                mode = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "mode"), None)
                if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and \
                        set(mode.value) & set("wax+"):
                    how = "open"
            if how:
                out.add(f"{name} {how}")
    return out
