"""`check --json` and the table written site by site (issue 38, memory): check's `keep` is
given each site's final decision once the walk in address order is past it, the CLI's writer
keeps no window of a site after making its entry, and what it writes is what the whole
document says (json.dumps(doc, indent=2), the same table)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.synthetic_asm import build
from tests.helpers import fixture_files
from usdtpatch import api
from usdtpatch.analysis import candidacy
from usdtpatch.analysis import check as check_module
from usdtpatch.analysis.check import Keep, SiteCheck, check
from usdtpatch.cli.cmd_check import build_document, written_document
from usdtpatch.errors import UsdtpatchError
from usdtpatch.report.checkjson import Encoded, SiteWriter, json_pieces
from usdtpatch.report.plain import JoinedRows, check_text, table


@pytest.fixture(scope="module")
def many_sites(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("as") is None or shutil.which("ld") is None:
        pytest.skip("binutils' as and ld are needed")
    return build(tmp_path_factory.mktemp("written"), 300)


def _usable() -> list[Path]:
    out = []
    for p in fixture_files():
        try:
            api.load(p)
        except UsdtpatchError:
            continue
        out.append(p)
    return out


def _recorder(seen: list[SiteCheck]) -> Keep:
    def keep(sc: SiteCheck) -> SiteCheck:
        seen.append(sc)
        return sc
    return keep


def test_keep_is_given_each_sites_final_decision(many_sites: Path) -> None:
    """For every fixture (joined, re-laid, backward and refused windows among them) and a
    library of 300 sites: the sites kept are the sites check reports without `keep`, each
    given once, in address order."""
    files = [*_usable(), many_sites]
    assert len(files) > 30
    for path in files:
        probes = api.load(path)
        whole = check(probes)
        seen: list[SiteCheck] = []

        kept = check(probes, keep=_recorder(seen))
        assert kept.sites == whole.sites, path.name
        assert kept.findings == whole.findings, path.name
        assert sorted(s.probe.index for s in seen) == [p.index for p in probes.probes]
        addresses = [s.probe.address for s in seen]
        assert addresses == sorted(addresses), path.name


def test_keep_is_given_a_site_before_the_last_is_checked(many_sites: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """The first site is settled while the walk is a few sites past it, not at the end."""
    made: list[int] = []
    at_keep: list[int] = []
    real = candidacy.site_candidacy  # asked once by each site's own check

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(check_module, "site_candidacy", counted)

    def keep(sc: SiteCheck) -> SiteCheck:
        at_keep.append(len(made))
        return sc
    check(api.load(many_sites), keep=keep)
    assert len(made) == len(at_keep) == 300
    assert at_keep[0] < 40  # sites 16 bytes apart: SETTLED (512) bytes past is ~33 sites


def test_the_writer_keeps_no_window_and_writes_the_whole_document(many_sites: Path) -> None:
    """The writer's report holds no window of any site; its JSON text and its table are the
    whole document's (every fixture in one document, an input not ELF among them)."""
    paths = [str(p) for p in (*fixture_files(), Path(__file__), many_sites)]
    options = {"fork_guard": "never"}
    whole = build_document(paths, None, "error", None, options)
    writer = SiteWriter(table=False)
    got = api.check_keeping(many_sites, writer.start, **options)
    assert got.report.sites and all(s.window is None for s in got.report.sites)
    err = io.StringIO()
    doc, failed = written_document(paths, err, "error", False, options)
    assert doc["errors"] == whole["errors"] != []
    assert "".join(json_pieces(doc)) == json.dumps(whole, indent=2) + "\n"
    assert failed == any(f["severity"] == "error" for fl in whole["files"]
                         for f in [*fl["findings"], *(x for s in fl["sites"]
                                                      for x in s["findings"])])
    table, _ = written_document(paths, io.StringIO(), "error", True, options)
    for summary_only in (False, True):
        assert check_text(table, summary_only, None) == check_text(whole, summary_only, None)


@pytest.mark.parametrize("doc", [
    {"a": [], "b": {"c": [1, {"d": "x\ny\u00e9\ud800"}]}},
    [{"files": [{"sites": [{"k": [1, 2], "e": {}}, {"k": []}], "n": None}]}, "z", 1.5],
    {"files": [{"x": True, "sites": [], "f": [{"a": [[]]}]}], "errors": [{"p": "q"}]},
])
def test_json_pieces_write_encoded_lists_as_json_dumps(doc: Any) -> None:
    """Each list of `doc` outside lists made an Encoded list (at every depth of dicts, empty
    ones too, the document itself): the text is json.dumps(doc, indent=2)'s."""
    def encoded(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: encoded(x) for k, x in v.items()}
        if isinstance(v, list):
            return Encoded(Encoded.encode(x) for x in v)
        return v
    assert "".join(json_pieces(encoded(doc))) == json.dumps(doc, indent=2) + "\n"
    like = Encoded.plain({"i": 1, "t": "w" * 50})  # compressed against a preset dictionary
    with_dict = Encoded((Encoded.encode({"i": i, "t": "w" * 50}, like) for i in range(3)), like)
    read: list[Any] = [*with_dict]
    assert read == [{"i": i, "t": "w" * 50} for i in range(3)]
    big = {"sites": Encoded(Encoded.encode({"i": i, "t": "w" * 50}) for i in range(3000))}
    pieces = list(json_pieces(big))
    assert len(pieces) > 2
    assert "".join(pieces) == json.dumps({"sites": [{"i": i, "t": "w" * 50}
                                                    for i in range(3000)]}, indent=2) + "\n"


def test_joined_rows_lay_out_as_their_cells() -> None:
    """A table of 9,000 rows (read 4,096 at a time) from JoinedRows is the table of the same
    cells as tuples, on an unlimited page and on narrow ones (folded, or below the row); a
    cell holding the separator keeps its row as cells."""
    import random

    rng = random.Random(38)
    words = ["a", "bb", "ccc-dd", "eeeeeeeeeeee", "-", "", "x y z"]
    headers = ("probe", "address", "findings")
    rows = [tuple(" ".join(rng.choice(words) for _ in range(rng.randrange(4)))
                  for _ in headers) for _ in range(9000)]
    joined = JoinedRows([JoinedRows.join(r) for r in rows])
    assert [tuple(r) for r in joined] == rows and len(joined) == 9000
    assert [tuple(r) for r in joined[4000:4100]] == rows[4000:4100]
    for width in (None, 30, 45, 200):
        got = table(headers, joined, (False, False, True), width)
        assert got == table(headers, rows, (False, False, True), width)
        assert len(got) > 9000
    assert JoinedRows.join(("a", "b\x1fc")) == ("a", "b\x1fc")
    assert JoinedRows([JoinedRows.join(("a", "b\x1fc"))])[0] == ("a", "b\x1fc")
