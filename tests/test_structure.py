"""The house rules a reviewer would check (issue 23), on the package and, each, on a small
fake tree it must reject: no import circle between files or between folders (every import,
also inside functions; those under `if TYPE_CHECKING:` never run and are left out); the layers
of docs/architecture.md hold (every module in one, every import to its own layer or one
below); nothing below the library imports the library, the CLI, report/ or the package face;
versioned documents are made in report/ only; every module the page names exists, and so does
every type of its types table where the table says; each document is made by the module, and
described on the page, its row gives; the page names every function of the library's face.
And the rules of issue 35: findings are made from the registry only, the dynamic section is
read in elf/ only, cli/ and integrate/ use the library's face only, records of five or more
fields are built by keyword, and tests take no new private name; no new module writes a file
past io.py's write_atomic.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests import structure as st
from tests.helpers import ROOT

PACKAGE = ROOT / "usdtpatch"
PAGE = ROOT / "docs" / "architecture.md"
IMPORTS = st.imports(PACKAGE)

ABOVE_THE_LIBRARY = ("usdtpatch.api", "usdtpatch.cli", "usdtpatch.report",
                     "usdtpatch.integrate")


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp / "pkg"


# --- circles ---------------------------------------------------------------------------------

def test_no_file_circle() -> None:
    assert st.circles(st.file_edges(IMPORTS)) == []


def test_no_folder_circle() -> None:
    assert st.circles(st.folder_edges(IMPORTS)) == []


def test_a_circle_is_found_through_imports_in_functions(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def f():\n    from . import a\n    return a\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n",
        "pkg/d.py": "import pkg.c\n",
    })
    edges = st.file_edges(st.imports(pkg))
    assert st.circles(edges) == [["pkg.a", "pkg.b"]]  # c <-> d only under TYPE_CHECKING
    assert st.circles(edges - {("pkg.b", "pkg.a")}) == []


def test_a_folder_circle_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/x/__init__.py": "", "pkg/y/__init__.py": "",
        "pkg/x/m.py": "from pkg.y.n import thing\n",
        "pkg/y/n.py": "thing = 1\n\ndef g():\n    from pkg.x import m\n    return m\n",
        "pkg/y/o.py": "from ..x import m\n",  # relative, two levels up
    })
    imps = st.imports(pkg)
    assert ("pkg.y.o", "pkg.x.m") in st.file_edges(imps)
    assert st.circles(st.folder_edges(imps)) == [["pkg.x", "pkg.y"]]
    assert st.circles(st.file_edges(imps)) == [["pkg.x.m", "pkg.y.n"]]


# --- layers ----------------------------------------------------------------------------------

def test_nothing_below_the_library_imports_above_it() -> None:
    assert _upward(IMPORTS, "usdtpatch") == []


def _upward(found: list[st.Import], top: str) -> list[st.Import]:
    above = tuple(m.replace("usdtpatch", top, 1) for m in ABOVE_THE_LIBRARY)
    def is_above(m: str) -> bool:
        return m == top or m.startswith(f"{top}.__main__") or any(
            m == a or m.startswith(a + ".") for a in above)
    return [i for i in found if not is_above(i.source) and is_above(i.target)]


def test_an_import_of_the_library_or_the_face_from_below_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "__version__ = '1'\n", "pkg/api.py": "", "pkg/elf/__init__.py": "",
        "pkg/elf/a.py": "from pkg import __version__\n",
        "pkg/elf/b.py": "def f():\n    from pkg import api\n    return api\n",
        "pkg/report/__init__.py": "", "pkg/report/r.py": "from pkg import api\n",
    })
    found = {(i.source, i.target) for i in _upward(st.imports(pkg), "pkg")}
    assert found == {("pkg.elf.a", "pkg"), ("pkg.elf.b", "pkg.api")}


def test_the_layers_of_the_architecture_page_hold() -> None:
    layers = st.parse_layers(PAGE.read_text())
    assert len(layers) >= 5, "docs/architecture.md has no layer table"
    assert st.layer_problems(PACKAGE, layers) == []


def test_an_import_up_the_layers_and_a_module_in_none_are_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/api.py": "", "pkg/new.py": "",
        "pkg/elf/__init__.py": "", "pkg/elf/a.py": "from pkg import api\n",
    })
    page = ("| layer | what | modules |\n|---|---|---|\n| 1 | the face | `__init__.py` |\n"
            "| 2 | the library | `api.py` |\n| 3 | ELF | `elf/` |\n")
    layers = st.parse_layers(page)
    assert layers == [["__init__.py"], ["api.py"], ["elf/"]]
    assert st.layer_problems(pkg, layers) == [
        "pkg.new: in no layer (as new.py)", "pkg.elf.a:1 imports pkg.api, a layer above it"]


# --- documents and names ---------------------------------------------------------------------

def test_documents_are_made_in_report_only() -> None:
    assert st.document_makers(PACKAGE, "usdtpatch.report") == []


def test_a_document_made_elsewhere_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/report/__init__.py": "",
        "pkg/report/doc.py": "def d():\n    return {'schema': 'x', 'schema_version': 1}\n",
        "pkg/live/__init__.py": "",
        "pkg/live/k.py": "def to_json():\n    return {'schema': 'k', 'schema_version': 1}\n",
        "pkg/live/s.py": "X = {'$schema': 'sarif', 'version': '2.1.0'}\n",
        "pkg/live/ok.py": "def read(doc):\n    return doc['schema_version']\n",
    })
    assert st.document_makers(pkg, "pkg.report") == ["pkg.live.k:2", "pkg.live.s:1"]


# What docs/architecture.md says the two lowest folders import from the rest of the package.
LOWEST_IMPORTS = {"elf": {"usdtpatch.errors", "usdtpatch.jsondoc", "usdtpatch.kernelfacts"},
                  "x86": {"usdtpatch.kernelfacts"}}


def test_the_lowest_folders_import_what_the_page_says() -> None:
    for name, allowed in LOWEST_IMPORTS.items():
        home = f"usdtpatch.{name}"
        beyond = {i.target for i in IMPORTS if (i.source == home or i.source.startswith(
            home + ".")) and not (i.target == home or i.target.startswith(home + "."))}
        assert beyond <= allowed, (name, sorted(beyond - allowed))
    said = ("`errors.py`, `jsondoc.py` and `kernelfacts.py`, and `x86/` nothing outside `x86/` "
            "but `kernelfacts.py`")
    assert said in " ".join(PAGE.read_text().split())


# A plan file's findings are read back as the file wrote them (their codes registered, their
# messages and hints the writer's): reading one is not making one.
FINDINGS_READ_BACK = {"usdtpatch.sequences.plan"}


def test_findings_are_made_from_the_registry_only() -> None:
    """Issue 35, item 2: a finding is made only by its registered code's `finding`, which
    gives the registry's hint (and its severity, or another it is registered with)."""
    made = st.finding_makers(PACKAGE, "usdtpatch.findings")
    assert [m for m in made if m.split(":")[0] not in FINDINGS_READ_BACK] == []


def test_a_finding_made_by_hand_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/findings.py": "def Finding(*a): ...\n",
        "pkg/a.py": "from pkg.findings import Finding\nX = Finding('c', 's', 'm', 'h')\n",
        "pkg/b.py": "from dataclasses import replace\n"
                    "def f(x):\n    return replace(x, hint='mine'), replace(x, where='w')\n",
        "pkg/c.py": "def f(code):\n    return code.finding('m', 'w')\n",
    })
    assert st.finding_makers(pkg, "pkg.findings") == ["pkg.a:2", "pkg.b:3"]


DYNAMIC_HOMES = ("usdtpatch.elf.model", "usdtpatch.elf.image")


def test_the_dynamic_section_is_read_in_one_module() -> None:
    """Issue 35, item 3: the DT_* tags are named, and PT_DYNAMIC read, in elf/model.py only
    (elf/image.py defines the segment types); every other module calls its readers."""
    assert st.dynamic_readers(PACKAGE, DYNAMIC_HOMES) == []


def test_a_second_dynamic_reader_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/elf/__init__.py": "",
        "pkg/elf/model.py": "DT_NULL = 0\nPT_DYNAMIC = 2\n",
        "pkg/a.py": "from pkg.elf.model import PT_DYNAMIC\nDT_HASH = 4\n"
                    "def f(s):\n    return s.type == PT_DYNAMIC\n",
        "pkg/b.py": "from pkg.elf.model import DT_NULL\nX: int = DT_NULL\nDT_X: int = 1\n",
    })
    assert st.dynamic_readers(pkg, ("pkg.elf.model",)) == ["pkg.a:1", "pkg.a:2", "pkg.a:4",
                                                            "pkg.b:3"]


def test_cli_and_integrate_use_only_the_public_face() -> None:
    """Issue 35, item 4: the command line and the build integration import nothing of the
    library but its face (usdtpatch.api's `__all__`, the package's) and report/; no private
    name of api."""
    assert st.face_violations(PACKAGE) == []


def test_a_use_past_the_face_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "__all__ = ['__version__']\n__version__ = '1'\n",
        "pkg/api.py": "__all__ = ['rewrite', 'Form']\ndef rewrite(): ...\ndef _rewritten(): ...\n",
        "pkg/elf/__init__.py": "", "pkg/elf/image.py": "def parse_elf(): ...\n",
        "pkg/report/__init__.py": "", "pkg/report/r.py": "def render(): ...\n",
        "pkg/cli/__init__.py": "from pkg import __version__\nfrom pkg.report.r import render\n",
        "pkg/cli/c.py": "from pkg import api\nfrom pkg.api import Form, rewrite\n"
                        "from pkg.elf.image import parse_elf\n"
                        "def f():\n    return api.rewrite(), api._rewritten()\n",
        "pkg/integrate/__init__.py": "",
        "pkg/integrate/s.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg.elf.image import parse_elf\n"
                              "def f():\n    from ..api import _rewritten\n"
                              "    import pkg.elf.image\n    from pkg import elf, version\n"
                              "    return _rewritten\n",
        "pkg/analysis/__init__.py": "",
        "pkg/analysis/a.py": "from pkg.elf.image import parse_elf\n",  # not a caller
    })
    assert st.face_violations(pkg) == [
        "pkg.cli.c:3 pkg.elf.image.parse_elf", "pkg.cli.c:5 pkg.api._rewritten",
        "pkg.integrate.s:3 pkg.elf.image.parse_elf", "pkg.integrate.s:5 pkg.api._rewritten",
        "pkg.integrate.s:6 pkg.elf.image", "pkg.integrate.s:7 pkg.elf",
        "pkg.integrate.s:7 pkg.version"]


def test_records_are_built_by_keyword() -> None:
    """Issue 35, item 5: a dataclass record is built by keyword when it takes five or more
    arguments (157 constructions were positional)."""
    assert st.positional_records(PACKAGE) == []


def test_a_record_built_by_position_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/r.py": "import dataclasses\nfrom dataclasses import dataclass\n"
                    "@dataclass(frozen=True)\nclass A:\n    a: int\n    b: int\n    c: int\n"
                    "    d: int\n    e: int\n"
                    "@dataclasses.dataclass\nclass B:\n    a: int\n"
                    "class C:\n    def __init__(self, *a: int) -> None: ...\n",
        "pkg/u.py": "from pkg import r\nfrom pkg.r import A, C\n"
                    "x = A(1, 2, 3, 4, 5)\n"  # found
                    "y = A(1, 2, 3, 4, e=5), A(a=1, b=2, c=3, d=4, e=5)\n"  # four: kept
                    "z = r.A(1, 2, 3,\n      4, 5)\n"  # found, through the module
                    "w = C(1, 2, 3, 4, 5), r.B(1)\n",  # not a record; one argument
    })
    assert st.record_classes(pkg) == {"A", "B"}
    assert st.positional_records(pkg) == ["pkg.u:3 A", "pkg.u:5 A"]


def test_every_module_the_architecture_page_names_exists() -> None:
    assert st.missing_names(PAGE.read_text(), PACKAGE) == []


def test_a_name_of_a_module_that_is_gone_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/findings.py": "", "pkg/api.py": "def check(): ...\n",
        "pkg/analysis/__init__.py": "", "pkg/analysis/check.py": "",
        "pkg/report/__init__.py": "", "pkg/report/plan.py": "def plan_json(): ...\n",
        "pkg/sequences/__init__.py": "", "pkg/sequences/plan.py": "PLAN = 1\n",
        "tests/golden/x.txt": "",
    })
    page = ("`analysis/check.py` `poke/plan.py` `report/` `sites/` `findings.py` "
            "`pkg.api.check` `pkg.api.no_such` `report.plan.plan_json`, "
            "`sequences.plan.plan_json` `sequences.plan.PLAN` `tests/golden/` `rich` "
            "`--form auto` `pkg/io.py`")
    assert st.missing_names(page, pkg) == ["poke/plan.py", "sites/", "pkg.api.no_such",
                                           "sequences.plan.plan_json", "pkg/io.py"]


def test_every_type_the_architecture_page_names_is_made_where_it_says() -> None:
    """The central types table: each type is a class (or a name assigned) of the module its
    row gives (issue 35, item 6: it named a `Built` that did not exist)."""
    assert st.misplaced_types(PAGE.read_text(), PACKAGE) == []


def test_a_type_gone_or_moved_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/elf/__init__.py": "",
        "pkg/elf/image.py": "from pkg.x import Section\nclass ElfImage: ...\nSegment = int\n",
        "pkg/forkguard/__init__.py": "", "pkg/forkguard/b.py": "class GuardBuild: ...\n",
    })
    page = ("| type | module | what it is |\n|---|---|---|\n"
            "| `ElfImage`, `Segment`, `Section` | `elf/image.py` | the file |\n"
            "| `GuardBuild` | `forkguard/` | the guard |\n"
            "| `Built` | `rewriter/build.py` | the built file |\n"
            "| `SiteDecision` (`Action`) | `elf/image.py` | a decision |\n\n"
            "| engine | role | module |\n|---|---|---|\n| `Nothing` | x | `elf/image.py` |\n")
    assert st.misplaced_types(page, pkg) == [
        "Section (elf/image.py)", "Built (rewriter/build.py)", "SiteDecision (elf/image.py)",
        "Action (elf/image.py)"]


def test_each_document_is_made_by_the_module_the_page_names() -> None:
    """The documents table: each schema's envelope is made by the module of its row, and
    every schema made has a row."""
    assert st.document_homes(PACKAGE) == st.parse_documents(PAGE.read_text())


def test_a_document_made_elsewhere_than_the_page_says_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/report/__init__.py": "", "pkg/seq/__init__.py": "",
        "pkg/report/envelope.py": "def envelope(schema, version): ...\n",
        "pkg/report/a.py": "from pkg.report.envelope import envelope\nA_SCHEMA = 'p/a'\n"
                           "def d():\n    return envelope(A_SCHEMA, 1)\n",
        "pkg/seq/plan.py": "PLAN_SCHEMA = 'p/plan'\n",
        "pkg/report/plan.py": "from pkg.seq.plan import PLAN_SCHEMA as S\n"
                              "from pkg.report import envelope as e\n"
                              "def d():\n    return e.envelope(S, 1)\n",
        "pkg/report/b.py": "from .envelope import envelope\n"
                           "def d():\n    return envelope('p/b', 1), envelope(x, 1)\n",
    })
    page = ("| document (schema) | made by | page |\n|---|---|---|\n"
            "| `p/a` (a) | `report/a.py` | [a.md](a.md) |\n"
            "| `p/plan` | `report/plan.py` (read back by `seq/plan.py`) | [p.md](p.md) |\n"
            "| `p/b` | `report/a.py` | [b.md](b.md) |\n| `p/gone` | `report/gone.py` | - |\n")
    assert st.document_homes(pkg) == {"p/a": {"report/a.py"}, "p/plan": {"report/plan.py"},
                                      "p/b": {"report/b.py"}}
    assert st.parse_documents(page) == {"p/a": {"report/a.py"}, "p/plan": {"report/plan.py"},
                                        "p/b": {"report/a.py"}, "p/gone": {"report/gone.py"}}


def test_each_document_is_documented_on_the_page_its_row_links() -> None:
    """The documents table links each schema's page; that page names it (the rows of
    `show` and `bench` linked pages that do not describe them)."""
    assert st.undocumented_documents(PAGE.read_text(), PAGE.parent) == []


def test_a_document_its_page_does_not_describe_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text('# `p/a`\n\n```json\n{"schema": "p/b"}\n```\n')
    page = ("| document (schema) | made by | page |\n|---|---|---|\n"
            "| `p/a` (a) | `report/a.py` | [a.md](a.md) |\n"
            "| `p/b` | `report/b.py` | [a.md](a.md#b) |\n"
            "| `p/c` | `report/c.py` | [a.md](a.md) |\n"
            "| `p/d` | `report/d.py` | [gone.md](gone.md) |\n"
            "| `p/e` | `report/e.py` | not yet |\n")
    assert st.undocumented_documents(page, tmp_path) == ["p/c (a.md)", "p/d (gone.md)"]


# What writes a file other than io.py's write_atomic (docs/architecture.md, "The flow": every
# output but bench --chart's PNG goes through it); the others write no output of a command.
# The list may only shrink.
OTHER_WRITERS = frozenset({
    "usdtpatch.report.bench .savefig",  # bench --chart's PNG, matplotlib's own write
    "usdtpatch.cli.cmd_dtrace .write_text",  # dtrace -G's C source, in a temporary folder
    "usdtpatch.forkguard.recipe .write_text",  # forkguard/_code.py: a maintainer's tool
    "usdtpatch.cli os.open",  # /dev/null, put in place of a stdout whose reader has gone
    # rewrite --tree: the further names of a file write_atomic wrote, one link and rename each
    "usdtpatch.integrate.tree os.link", "usdtpatch.integrate.tree os.rename",
    # the bench's programs and its copy of the JDK, in its work folder
    "usdtpatch.live.bench.runner .write_text", "usdtpatch.live.bench.runner os.replace",
    "usdtpatch.live.bench.runner shutil.copy2", "usdtpatch.live.bench.runner shutil.copytree",
    "usdtpatch.live.perf os.open",  # the kernel's uprobe_events (tracefs), not a file's bytes
})


def test_outputs_are_written_by_write_atomic_only() -> None:
    assert st.file_writers(PACKAGE, "usdtpatch.io") - OTHER_WRITERS == set()


def test_a_file_written_past_write_atomic_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/io.py": "import os\ndef write_atomic(p, b):\n    os.rename(p, p)\n",
        "pkg/a.py": "import os, shutil\nfrom pathlib import Path\n"
                    "def f(p, fig):\n    Path(p).write_bytes(b'')\n    fig.savefig(p)\n"
                    "    open(p, 'ab').close()\n    open(p, mode='w').close()\n"
                    "    os.close(os.open(p, os.O_WRONLY | os.O_CREAT))\n"
                    "    shutil.move(p, p)\n",
        "pkg/b.py": "import os\nfrom dataclasses import replace\n"
                    "def g(p, x):\n    open(p).close(); open(p, 'rb').close()\n"
                    "    os.close(os.open(p, os.O_RDONLY))\n"
                    "    return replace(x, a=1), p.replace('a', 'b'), os.replace(p, p)\n",
    })
    assert st.file_writers(pkg, "pkg.io") == {
        "pkg.a .write_bytes", "pkg.a .savefig", "pkg.a open", "pkg.a os.open",
        "pkg.a shutil.move", "pkg.b os.replace"}


def _library_paragraph(page: str) -> str:
    return next(p for p in page.split("\n\n") if p.startswith("`usdtpatch.api` is the library"))


def test_the_architecture_page_names_every_function_of_the_face() -> None:
    """The page's paragraph on the library names every function of api's `__all__` (it
    left out `rewrite_plan`, `read_plan`, `no_match` and the demangler)."""
    text = _library_paragraph(PAGE.read_text())
    assert st.unnamed_functions(text, PACKAGE / "api.py") == []


def test_a_function_of_the_face_the_page_leaves_out_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/api.py": "__all__ = ['CODES', 'Plan', 'load', 'plan', 'read_plan', 'rewrite_bytes']\n",
    })
    text = "`load(mapped=True)`, `plan(protocol=...)`, `Rewritten`; rewrite_bytes, `read`"
    assert st.unnamed_functions(text, pkg / "api.py") == ["read_plan", "rewrite_bytes"]


def test_the_version_is_the_projects() -> None:
    from usdtpatch.version import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__


# --- engines ---------------------------------------------------------------------------------

# iced-x86 has two roles, each in one module: re-encoding (x86/relocate.py) and the sweep's
# fallback for what capstone does not decode (x86/lengths.py), apart because relocate reads
# its output back with the sweep (one module would close a circle with x86/decode.py)
TWO_HOMES = {"iced_x86": 2}


def test_each_engine_is_imported_by_the_one_module_the_page_names() -> None:
    found = st.engine_homes(PACKAGE)
    assert all(len(users) == TWO_HOMES.get(e, 1) for e, users in found.items()), found
    assert found == st.parse_engines(PAGE.read_text())


def test_an_engine_imported_by_a_second_module_is_found(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/x86/__init__.py": "",
        "pkg/x86/decode.py": "import capstone\nimport os.path\n",
        "pkg/x86/show.py": "def f():\n    from capstone import Cs\n    return Cs\n",
        "pkg/p/__init__.py": "import keystone\nfrom . import x\n", "pkg/p/x.py": "",
    })
    page = ("| engine | role | module |\n|---|---|---|\n"
            "| `capstone` (capstone) | disassembly | `x86/decode.py` |\n"
            "| `keystone` (keystone-engine) | assembling | `p/` |\n")
    assert st.parse_engines(page) == {"capstone": {"x86/decode.py"}, "keystone": {"p/"}}
    assert st.engine_homes(pkg) == {"capstone": {"x86/decode.py", "x86/show.py"},
                                    "keystone": {"p/"}}


# --- tests and private names -----------------------------------------------------------------

# Private names tests still take, in modules other helpers of this session have (analysis/,
# forkguard/, rewriter/plan.py, verification/, elf/, x86/, live/perf.py): the list may only
# shrink. None is in cli/, report/, live/kcheck.py, live/bench/ or integrate/.
KNOWN_PRIVATE = frozenset({
    "usdtpatch.analysis.targets._Graph", "usdtpatch.analysis.targets._origin",
    "usdtpatch.analysis.waysin._candidates", "usdtpatch.analysis.waysin._code_hits",
    "usdtpatch.analysis.waysin._regions", "usdtpatch.analysis.waysin._scan_code",
    "usdtpatch.analysis.waysin._spans", "usdtpatch.elf.cfi._walk_eh_frame",
    "usdtpatch.elf.writer._cut_at", "usdtpatch.forkguard._code", "usdtpatch.forkguard._dynamic",
    "usdtpatch.forkguard._relas", "usdtpatch.forkguard._symbol", "usdtpatch.live.perf._write_event",
    "usdtpatch.rewriter.plan._entries", "usdtpatch.rewriter.plan._retarget_patches",
    "usdtpatch.verification.equivalence._gprs", "usdtpatch.verification.equivalence._new_pair",
    "usdtpatch.verification.equivalence._verify", "usdtpatch.x86.decode._lite",
    "usdtpatch.x86.decode._lite_rows", "usdtpatch.x86.describe._KNOWN_TEXT",
})


def test_tests_take_no_new_private_name() -> None:
    assert st.private_uses(ROOT / "tests", "usdtpatch") - KNOWN_PRIVATE == set()


def test_a_private_name_a_test_takes_is_found(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(
        "from pkg.report.plain import _rich_width, table\nfrom pkg.live import kcheck as k\n"
        "import pkg.cli\n\ndef test() -> None:\n    k._plan_for(1)\n    pkg.cli.__name__\n"
        "    k.public(1)\n")
    assert st.private_uses(tmp_path, "pkg") == {"pkg.report.plain._rich_width",
                                                "pkg.live.kcheck._plan_for"}
