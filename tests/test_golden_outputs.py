"""Golden files of every output of every command (issue 23: moving where documents are made
and rendered must not change one byte a user sees).

On the fixtures the whole text is kept (tests/golden/out-*); on the real binaries (REAL_BINARIES)
a digest, line and byte count per output (tests/golden/real-NAME.txt), the actual outputs written
to build/golden-out/real-NAME/ (to see a change: run this test on the commit before and diff the
two folders). Regenerate with USDTPATCH_UPDATE_GOLDEN=1 and review the diff.

Only what changes from run to run is normalized, and nothing else (`_norm`):
- the source tree's path and this test's temporary folder (ROOT/ and TMP),
- the package version (the `tool` envelope's `version`, "usdtpatch X.Y.Z" in pages and text),
- measured times: JSON `seconds` members, verify's "in N.NN s", the rewrite page's "N s in
  all" and per-file "time: N s".
A JSON output (one document indented by 2, or a document per line) is kept in the form a
reviewer reads in a diff (_json_lines): each site, probe, SARIF result or rule on one line
after where it is in the document, the rest indented; the test first checks the output is
exactly the layout its golden file names of what it parsed (so no byte of it goes unchecked).
An HTML page's long lines are broken before its sections, rows, headings and list items, each
piece on a line marked as a continuation (_html_lines), which joined give the page back.
`--form auto` is run with `--kernel 6.18` (else its line names the running kernel). The
rewritten files' digests pin their bytes, which hold the version in the restore marker's note:
a new version changes them (regenerate and review).
kcheck and bench need root and the live kernel, and their figures are measured: their renderers
are fed a report made here (every field set), and the text and document pinned.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.golden import GOLDEN, check_golden
from tests.helpers import REAL_BINARIES, ROOT, fixture, fixture_files, run_cli
from usdtpatch import __version__
from usdtpatch.live.bench.runner import BenchReport, Row
from usdtpatch.live.kcheck import Fault, KcheckReport, ProcessResult, SiteResult
from usdtpatch.report.bench import bench_json, print_bench
from usdtpatch.report.kcheck import kcheck_json, kcheck_text

FIXTURES = fixture_files()
NAMES = [p.name for p in FIXTURES]
REAL = {n: p for n, p in REAL_BINARIES.items() if p.is_file()}
OUT_DIR = ROOT / "build" / "golden-out"
# the same fixtures for the HTML page and `show` (their text is long): every form of window,
# a C++ file with an exception table, refusals
SHOWN = ["demo", "forms-mixed", "branch-after", "padded", "pie", "cxx-throw", "redzone-leaf",
         "retarget", "call-window", "aarch64"]

pytestmark = pytest.mark.skipif(not FIXTURES, reason="fixtures/bin holds no fixtures")


def _norm(text: str, tmp: Path | None = None) -> str:
    if tmp is not None:
        text = text.replace(str(tmp), "TMP")
    text = text.replace(str(ROOT) + "/", "")
    # the HTML page breaks a path at each slash with <wbr>
    text = text.replace("/<wbr>".join(str(ROOT).split("/")) + "/<wbr>", "")
    text = text.replace(f'"version": "{__version__}"', '"version": "VERSION"')
    # a rule's length fills the width left by its title, which holds a path
    text = re.sub("─{4,}", "─" * 4, text)
    text = text.replace(f"usdtpatch {__version__}", "usdtpatch VERSION")
    text = re.sub(r'"(seconds|attach_seconds|detach_seconds)": [0-9.e+-]+', r'"\1": 0', text)
    text = re.sub(r"thread runs in \d+\.\d\d s", "thread runs in N s", text)
    text = re.sub(r"\d+\.\d\d s in all;", "N s in all;", text)  # the rewrite page
    text = re.sub(r'time:</span> \d+\.\d\d s<', 'time:</span> N s<', text)
    return text


# The lists whose objects a JSON golden shows one per line: a site (check, show, plan, verify,
# rewrite), a probe (list), a SARIF result or rule.
PER_LINE = ("sites", "probes", "results", "rules")


def _json_lines(out: str) -> str:
    """A JSON output (one indented document, or one document per line) as its golden text,
    after checking the output is exactly json.dumps of what it holds in that layout (which
    the text's first line names): so the text below pins every byte. Made to be read in a
    diff: each object of a PER_LINE list is one line, `where {compact JSON}`, in the
    document's order; the rest of the document is indented, each such list replaced by a
    line that counts its objects."""
    if out.startswith("{\n"):
        docs, layout = [json.loads(out)], "one document, indent 2"
        assert out == json.dumps(docs[0], indent=2) + "\n"
    else:
        docs, layout = [json.loads(line) for line in out.splitlines()], "a document per line"
        assert out == "".join(json.dumps(d) + "\n" for d in docs)
    text = f"# JSON: {layout}; each object of {', '.join(PER_LINE)} on a line, below\n"
    for i, doc in enumerate(docs):
        rows: list[str] = []
        text += json.dumps(_skeleton(doc, f"[{i}]", rows), indent=1) + "\n" + "".join(rows)
    return text


def _skeleton(node: object, where: str, rows: list[str]) -> object:
    """`node` with every list of PER_LINE objects replaced by a count, their lines (where,
    then the object in compact JSON) added to `rows`."""
    if isinstance(node, dict):
        out: dict[str, object] = {}
        for k, v in node.items():
            at = f"{where}.{k}"
            if k in PER_LINE and isinstance(v, list) and all(isinstance(x, dict) for x in v):
                rows.extend(f"{at}[{j}] {json.dumps(x)}\n" for j, x in enumerate(v))
                out[k] = f"{len(v)} on the lines {at}[...] below"
            else:
                out[k] = _skeleton(v, at, rows)
        return out
    if isinstance(node, list):
        return [_skeleton(x, f"{where}[{j}]", rows) for j, x in enumerate(node)]
    return node


# An HTML page's long lines are broken before these tags in its golden file, each piece after
# the first on a line of its own that starts with CONTINUED (a character no page holds).
HTML_BREAKS = re.compile(r"(?=<(?:section|details|h2|h3|h4|table|tr|li)[ >])")
CONTINUED = "\u21b3"


def _html_lines(page: str) -> str:
    """An HTML page as its golden text, made to be read in a diff: every line of more than
    200 characters broken before a section, a table row, a heading, a list item, each piece
    after the first on a line of its own starting with CONTINUED. The page has no such
    character, so the text still pins every byte (joining the pieces gives it back)."""
    assert CONTINUED not in page
    out = []
    for line in page.split("\n"):
        pieces = HTML_BREAKS.split(line) if len(line) > 200 else [line]
        out.append(f"\n{CONTINUED}".join(x for x in pieces if x) or line)
    text = "\n".join(out)
    assert text.replace(f"\n{CONTINUED}", "") == page
    return text


def _run(tmp: Path, *argv: str | Path, json_form: bool = False) -> str:
    """One command's exit status, stdout and stderr as one normalized text (`json_form`:
    a JSON output in the form of _json_lines)."""
    res = run_cli(*argv)
    out = _json_lines(res.out) if json_form and res.out else res.out
    return _norm(f"$ usdtpatch {' '.join(str(a) for a in argv)}\nrc {res.rc}\n{out}"
                 f"--- stderr\n{res.err}", tmp)


def _each(tmp: Path, names: list[str], *argv: str, json_form: bool = False) -> str:
    """A one-file command run on each of `names` (FILE goes first), one text."""
    return "".join(_run(tmp, argv[0], fixture(n), *argv[1:], json_form=json_form)
                   for n in names)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the fixtures: whole text --------------------------------------------------------------

def test_list(tmp_path: Path) -> None:
    check_golden("out-list.txt", _run(tmp_path, "list", *FIXTURES))
    check_golden("out-list-filtered.txt",
                 _run(tmp_path, "list", "--provider", "f*", "--probe", "*:e*", *FIXTURES))
    res = run_cli("list", "--json", *FIXTURES)
    check_golden("out-list.json", _norm(f"rc {res.rc}\n{_json_lines(res.out)}"))


@pytest.mark.parametrize("fmt", ["text", "summary", "json", "sarif"])
def test_check(tmp_path: Path, fmt: str) -> None:
    flags = {"text": [], "summary": ["--summary"], "json": ["--json"], "sarif": ["--sarif"]}[fmt]
    check_golden(f"out-check-{fmt}.txt", _run(tmp_path, "check", *flags, *FIXTURES,
                                             json_form=fmt in ("json", "sarif")))


def test_check_html_and_report_files(tmp_path: Path) -> None:
    shown = [fixture(n) for n in SHOWN]
    check_golden("out-check.html", _html_lines(_run(tmp_path, "check", "--html", *shown)))
    for ext in ("json", "sarif", "html"):  # --report FILE: the same documents, into FILE
        report = tmp_path / f"check.{ext}"
        res = run_cli("check", "--fail-on", "never", "--report", report, *shown)
        assert res.rc == 0 and res.out == "", res.err
        stdout = run_cli("check", f"--{ext}", "--fail-on", "never", *shown).out
        assert report.read_text() == stdout


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_show(tmp_path: Path, fmt: str) -> None:
    flags = ["--json"] if fmt == "json" else []
    text = _each(tmp_path, SHOWN, "show", "--probe", "*", *flags, json_form=bool(flags))
    text += _run(tmp_path, "show", fixture("branch-after"), "--probe", "branch:after",
                 "--context", "0", *flags, json_form=bool(flags))
    text += _run(tmp_path, "show", fixture("pie"), "--probe", "nosuch")
    check_golden(f"out-show-{fmt}.txt", text)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_plan(tmp_path: Path, fmt: str) -> None:
    flags = ["--json"] if fmt == "json" else []
    text = _each(tmp_path, NAMES, "plan", *flags, json_form=bool(flags))
    text += _run(tmp_path, "plan", fixture("pie"), "--kernel", "nop10-series", "--trampoline",
                 "0x7f0000000000", "--load-base", "0x7f1000000000", "--probe", "*:c*", *flags,
                 json_form=bool(flags))
    check_golden(f"out-plan-{fmt}.txt", text)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_verify(tmp_path: Path, fmt: str) -> None:
    flags = ["--json"] if fmt == "json" else []
    text = _each(tmp_path, NAMES, "verify", *flags, json_form=bool(flags))
    plan = tmp_path / "plan.json"
    plan.write_text(run_cli("plan", "--json", fixture("pie")).out)
    text += _run(tmp_path, "verify", fixture("pie"), "--plan", plan, *flags,
                 json_form=bool(flags))
    protocol = ROOT / "usdtpatch" / "sequences" / "protocols" / "nop5.toml"
    text += _run(tmp_path, "verify", fixture("demo"), "--protocol", protocol, *flags,
                 json_form=bool(flags))
    check_golden(f"out-verify-{fmt}.txt", text)


def test_rewrite_dry_run(tmp_path: Path) -> None:
    check_golden("out-rewrite-dry.txt",
                 _run(tmp_path, "rewrite", "--dry-run", "--kernel", "6.18", *FIXTURES))
    res = run_cli("rewrite", "--dry-run", "--json", "--kernel", "6.18",
                  "--report", tmp_path / "dry.sarif", *FIXTURES)
    check_golden("out-rewrite-dry.json", _norm(f"rc {res.rc}\n{_json_lines(res.out)}"
                                               f"--- stderr\n{res.err}", tmp_path))
    check_golden("out-rewrite-dry.sarif",
                 _norm(_json_lines((tmp_path / "dry.sarif").read_text()), tmp_path))
    check_golden("out-rewrite-forms.txt", "".join(
        _run(tmp_path, "rewrite", "--dry-run", *flags, fixture(n))
        for n in ("demo", "forms-mixed", "redzone-leaf", "fork", "call-window-shstk")
        for flags in (["--form", "combo10"], ["--form", "combo5", "--redzone-guard", "never"],
                      ["--kernel", "nop10-series", "--fork-guard", "never"],
                      ["--form", "nop5", "--calls", "emulate", "--no-verify"])))


def test_rewrite_restore(tmp_path: Path) -> None:
    """The real run (every fixture: its text, report, output digests), and restore."""
    out = tmp_path / "out"
    out.mkdir()
    text = _run(tmp_path, "rewrite", "--kernel", "6.18", "-o", out, "--report",
                tmp_path / "report.json", *FIXTURES)
    check_golden("out-rewrite.txt", text)
    check_golden("out-rewrite-report.json",
                 _norm(_json_lines((tmp_path / "report.json").read_text()), tmp_path))
    digests = [f"{p.name} {_sha(p.read_bytes())}\n" for p in sorted(out.iterdir())]
    check_golden("out-rewrite-digests.txt", "".join(digests))
    html = tmp_path / "page.html"
    run_cli("rewrite", "--dry-run", "--kernel", "6.18", "--report", html,
            *(fixture(n) for n in SHOWN))
    check_golden("out-rewrite-report.html", _html_lines(_norm(html.read_text(), tmp_path)))
    restored = tmp_path / "restored"
    restored.mkdir()
    text = "".join(_run(tmp_path, "restore", p, "-o", restored / p.name)
                   for p in sorted(out.iterdir()))
    text += _run(tmp_path, "restore", fixture("pie"), "-o", restored / "pie-again")
    check_golden("out-restore.txt", text)
    for p in sorted(restored.iterdir()):
        assert p.read_bytes() == fixture(p.name).read_bytes(), p.name


def test_dtrace_explain_demo_post_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = ROOT / "fixtures" / "src" / "probes.d"
    text = _run(tmp_path, "dtrace", "-h", "-s", script, "-o", tmp_path / "probes.h")
    text += _norm((tmp_path / "probes.h").read_text(), tmp_path)
    text += _run(tmp_path, "dtrace", "-h", "--no-semaphores", "-s", script, "-o",
                 tmp_path / "nosema.h")
    text += _norm((tmp_path / "nosema.h").read_text(), tmp_path)
    text += _run(tmp_path, "dtrace", "-G", "-k", "-s", script, "-o", tmp_path / "probes.o")
    # the semaphores' C source (the object itself is the compiler's)
    text += _norm((tmp_path / "probes.semaphores.c").read_text(), tmp_path)
    text += _run(tmp_path, "dtrace", "-s", script)
    check_golden("out-dtrace.txt", text)
    text = "".join(_run(tmp_path, "explain", *code)
                   for code in ([], ["red-zone-live"], ["[site-combo5-pc1]"], ["red-zone"]))
    check_golden("out-explain.txt", text)
    # a page wide enough that no line of the demo wraps: where rich wraps one depends on the
    # length of the paths in it (the checkout's, pytest's temporary folder)
    monkeypatch.setenv("COLUMNS", "1000")
    demo = _run(tmp_path, "demo", "--out", tmp_path / "demo")
    monkeypatch.delenv("COLUMNS")
    check_golden("out-demo.txt", demo.replace(str(ROOT / "usdtpatch"), "PKG"))
    target = tmp_path / "demo.bin"
    shutil.copyfile(fixture("demo"), target)
    text = _run(tmp_path, "post-link", target, "-o", tmp_path / "demo.out", "--report",
                tmp_path / "step.json")
    text += _norm((tmp_path / "step.json").read_text(), tmp_path)
    page = _norm((tmp_path / "step.html").read_text(), tmp_path)
    text += f"html page sha256 {_sha(page.encode())}\n"
    text += f"output sha256 {_sha((tmp_path / 'demo.out').read_bytes())}\n"
    failing = tmp_path / "redzone.bin"  # a failed step in place removes its file: a copy
    shutil.copyfile(fixture("redzone-leaf-nop5"), failing)
    text += _run(tmp_path, "post-link", failing, "--check-only", "--report",
                 tmp_path / "check.json")
    text += _norm((tmp_path / "check.json").read_text(), tmp_path)
    check_golden("out-post-link.txt", text)


# --- kcheck and bench: their renderers on reports made here --------------------------------

def _kcheck_report() -> KcheckReport:
    sites = [SiteResult("demo:greet", 0, 0x1139, 0x555555555139, b"\x90", 0, "", 12,
                        b"\xe8\x01\x02\x03\x04", True, 0x7fff0000, "nop5",
                        b"\xe8\x01\x02\x03\x04", 0x7fff0000, True, b"\x90", True),
             SiteResult("demo:reply", 1, 0x123f, 0x55555555523f, b"\x90", 0, "", 3, b"\xcc",
                        False, None, "int3", b"\xcc\x00\x00\x00\x00", None, False, b"\xcc",
                        False),
             SiteResult("demo:gone", 2, 0x1300, attach_error="Invalid argument")]
    command = ProcessResult(4242, "command", None, 2, sites, [0x7fff0000], exit_code=0,
                            inspected=True, samples_lost=1, throttled=2, other_faults=1)
    child = ProcessResult(4243, "fork", 4242, 1, [], [], optimized_at_fork=1, exit_signal=11)
    running = ProcessResult(4244, "exec", 4242, 1, [SiteResult("demo:greet", 0, 0x1139,
                                                               hits=4)], note="still running")
    faults = [Fault(4243, 4243, 11, 0x7fff0000, 0x7fff0000, 0x55555555513e, "demo:greet", True),
              Fault(4242, 4242, 11, 0, 0x401000, None, None, False)]
    return KcheckReport("/tmp/demo", ["./demo"], None, "6.18.0", [command, child, running],
                        faults, 1.5, False, 0.25, 0.125)


def _bench_report() -> BenchReport:
    trig = [Row("int3", "1-byte nop", "90", 5, 2_000_000, 1.25e6, 1.0, 800.0, 1.5, 1.0,
                (1.0, 1.0)),
            Row("nop5", "5-byte nop", "0f 1f 44 00 00", 5, 2_000_000, 6.5e6, 5.2, 153.8, 1.4,
                0.98, (5.0, 5.5))]
    jvm = [Row("jvm-nop5", "OpenJDK", "0f 1f 44 00 00", 3, 2_000_000, 3.0e6, 2.5, 333.3,
               812.0, 1.01, (2.4, 2.6), 0.75, 0.7)]
    return BenchReport("6.18.0", "AMD EPYC", 2_000_000, 2_000_000, 5, trig, jvm, 42.0,
                       ["a note"], generation="nop5", same_form="hdr-nop5",
                       same_form_ratio=(1.04, 0.97, 1.11))


def test_kcheck_and_bench_renderings() -> None:
    rep = _kcheck_report()
    check_golden("out-kcheck.txt",
                 kcheck_text(rep) + json.dumps(kcheck_json(rep), indent=2) + "\n")
    bench = _bench_report()
    buf = io.StringIO()
    print_bench(bench, buf)
    check_golden("out-bench.txt", buf.getvalue() + json.dumps(bench_json(bench), indent=2) + "\n")


# --- the real binaries: digests and counts -------------------------------------------------

def _real_outputs(name: str, path: Path, tmp: Path) -> Iterator[tuple[str, str]]:
    """(output name, normalized text) of every command on one real binary; the rewrite once."""
    yield "list", _run(tmp, "list", path)
    yield "list.json", _run(tmp, "list", "--json", path)
    for fmt in ("", "--json", "--sarif", "--html"):
        yield f"check{fmt.replace('--', '.')}", _run(tmp, "check", *([fmt] if fmt else []), path)
    yield "plan", _run(tmp, "plan", path)
    yield "plan.json", _run(tmp, "plan", "--json", path)
    yield "verify", _run(tmp, "verify", path)
    yield "verify.json", _run(tmp, "verify", "--json", path)
    out = tmp / f"{name}.out"
    report = tmp / f"{name}.json"
    yield "rewrite", _run(tmp, "rewrite", "--kernel", "6.18", "-o", out, "--report", report, path)
    yield "rewrite-report.json", _norm(report.read_text(), tmp)
    yield "rewrite-output.sha256", _sha(out.read_bytes()) + "\n"
    yield "restore", _run(tmp, "restore", out, "-o", tmp / f"{name}.restored")
    assert (tmp / f"{name}.restored").read_bytes() == path.read_bytes()


def _summary(label: str, text: str) -> str:
    return f"{label}: {text.count(chr(10))} lines, {len(text.encode())} bytes, sha256 " \
           f"{_sha(text.encode())}\n"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_binaries(name: str, tmp_path: Path) -> None:
    path = REAL[name]
    golden = GOLDEN / f"real-{name}.txt"
    head = f"{path} sha256 {_sha(path.read_bytes())}\n"
    if golden.exists() and not golden.read_text().startswith(head):
        pytest.skip(f"{path} is not the file {golden} was made from (another package version)")
    keep = OUT_DIR / f"real-{name}"
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    lines = [head]
    for label, text in _real_outputs(name, path, tmp_path):
        (keep / label).write_text(text)
        lines.append(_summary(label, text))
    try:
        check_golden(f"real-{name}.txt", "".join(lines))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the outputs are in {keep}: run this test on the commit "
                             f"before, copy that folder, and diff the two") from None


def test_the_json_form_keeps_every_byte_and_a_site_per_line() -> None:
    doc = {"schema": "s", "files": [{"path": "p", "sites": [{"a": 1}, {"a": [2]}]}],
           "probes": [], "n": [1, 2]}
    text = _json_lines(json.dumps(doc, indent=2) + "\n")
    rows = [ln for ln in text.splitlines() if ln.startswith("[0].")]
    assert rows == ['[0].files[0].sites[0] {"a": 1}', '[0].files[0].sites[1] {"a": [2]}']
    assert '"sites": "2 on the lines [0].files[0].sites[...] below"' in text
    assert "one document, indent 2" in text.splitlines()[0]
    one = json.dumps(doc) + "\n"
    assert "a document per line" in _json_lines(one + one).splitlines()[0]
    for laid_out in (json.dumps(doc, indent=1) + "\n", json.dumps(doc, indent=2),
                     json.dumps(doc, separators=(",", ":")) + "\n"):
        with pytest.raises(AssertionError):  # a layout not the one named: not pinned
            _json_lines(laid_out)


def test_the_html_form_breaks_long_lines_and_keeps_every_byte() -> None:
    page = "<html>\n" + "<section><h2>a</h2><table><tr><td>1</td></tr><tr><td>2</td></tr>" \
        + "x" * 200 + "</table></section>\n<p>short <tr>kept</p>"
    text = _html_lines(page)
    assert text.splitlines()[1:4] == ["<section>", f"{CONTINUED}<h2>a</h2>",
                                      f"{CONTINUED}<table>"]
    assert text.splitlines()[-1] == "<p>short <tr>kept</p>"  # a short line stays whole
    assert text.replace(f"\n{CONTINUED}", "") == page
    with pytest.raises(AssertionError):  # a page holding the mark could not be pinned
        _html_lines(page + CONTINUED)


def test_normalizing_keeps_what_is_not_volatile(tmp_path: Path) -> None:
    """_norm takes out the volatile parts only: a changed figure, name or count stays."""
    norm: Callable[[str], str] = lambda t: _norm(t, tmp_path)  # noqa: E731
    assert norm(f'{tmp_path}/x "seconds": 1.5, "version": "{__version__}"') == \
        'TMP/x "seconds": 0, "version": "VERSION"'
    assert norm("thread runs in 0.45 s; 1.25 s in all; time:</span> 0.25 s<") == \
        "thread runs in N s; N s in all; time:</span> N s<"
    for kept in ('"runs": 12', '"seconds_total": 3', "in 0.45 s", '"version": "9.9.9"',
                 "/usr/bin/python3.11", "usdtpatch 9.9"):
        assert norm(kept) == kept
