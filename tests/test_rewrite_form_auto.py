"""`rewrite --form auto` (the default) and `--kernel`: the form the kernel optimizes.

The generation is told by the uprobe syscall's errno (ENXIO: 6.18..7.2 -> nop5; EPROTO: the
nop10 series -> combo10; ENOSYS or anything else: no optimization -> the file is left as it
is). The detector is faked here for the generations this machine is not; `auto` on this
machine's kernel is checked where it has the uprobe syscall.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from tests.helpers import NOP5_GEN, NOP10_GEN, fixture, run_cli
from usdtpatch import api
from usdtpatch.analysis.forms import Form
from usdtpatch.kernelfacts import Generation
from usdtpatch.live.perf import has_uprobe_syscall
from usdtpatch.rewriter import kernel as kmod
from usdtpatch.rewriter.kernel import choose_form, detect_kernel


@pytest.mark.parametrize(("err", "gen", "form"), [
    (errno.ENXIO, NOP5_GEN, Form.NOP5),
    (errno.EPROTO, NOP10_GEN, Form.COMBO10),
    (errno.ENOSYS, None, None),
    (errno.EPERM, None, None),  # a seccomp filter's answer: no known generation
    (None, None, None),  # not x86-64 Linux, or the call did not fail
])
def test_the_errno_decides(err: int | None, gen: Generation | None, form: Form | None) -> None:
    assert detect_kernel(lambda: err)[0] is gen
    choice = choose_form("auto", errno_of=lambda: err)
    assert (choice.form, choice.kernel, choice.detected) == (form, gen, True)
    assert choice.why.startswith("--form auto")


def test_named_form_and_kernel_need_no_detection() -> None:
    def never() -> int | None:
        raise AssertionError("the kernel was asked")

    assert choose_form("combo5", errno_of=never).form is Form.COMBO5
    assert choose_form(Form.NOP5, "nop10-series", errno_of=never).form is Form.NOP5
    c = choose_form("auto", "nop10-series", errno_of=never)
    assert (c.form, c.kernel, c.detected) == (Form.COMBO10, NOP10_GEN, False)
    assert choose_form("auto", NOP5_GEN, errno_of=never).form is Form.NOP5
    with pytest.raises(ValueError, match="kernel"):
        choose_form("auto", "7.3", errno_of=never)


def _rewrite(tmp_path: Path, *opts: str) -> tuple[int, dict[str, object], Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    res = run_cli("rewrite", fixture("pie"), "-o", out, "--json", *opts)
    assert res.rc in (0, 1), res.err
    return res.rc, json.loads(res.out)["files"][0], out


def _codes(doc: dict[str, object]) -> list[str]:
    found = doc["findings"]
    assert isinstance(found, list)
    return [f["code"] for f in found]


@pytest.mark.skipif(not has_uprobe_syscall(), reason="this kernel has no uprobe syscall")
def test_auto_picks_nop5_on_this_kernel(tmp_path: Path) -> None:
    rc, doc, _ = _rewrite(tmp_path)
    assert rc == 0 and doc["form"] == "nop5" and doc["changed"]
    assert "form-chosen" in _codes(doc)


@pytest.mark.parametrize(("err", "form"), [(errno.ENXIO, "nop5"), (errno.EPROTO, "combo10")])
def test_auto_follows_the_faked_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       err: int, form: str) -> None:
    monkeypatch.setattr(kmod, "uprobe_syscall_errno", lambda: err)
    _rc, doc, out = _rewrite(tmp_path)
    assert doc["form"] == form and doc["changed"]
    named = _rewrite(tmp_path / "named", "--form", form)[1]
    assert doc["sites"] == named["sites"]  # the same decisions as naming the form
    assert out.read_bytes() == (tmp_path / "named" / "out").read_bytes()


def test_auto_leaves_the_file_alone_without_the_uprobe_syscall(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kmod, "uprobe_syscall_errno", lambda: errno.ENOSYS)
    rc, doc, out = _rewrite(tmp_path)
    assert rc == 0 and doc["form"] == "auto" and not doc["changed"] and doc["sites"] == []
    assert _codes(doc) == ["kernel-optimizes-nothing"]
    assert out.read_bytes() == fixture("pie").read_bytes()
    # a named form or kernel still rewrites
    assert _rewrite(tmp_path / "k", "--kernel", "6.18")[1]["changed"]
    text = run_cli("rewrite", fixture("pie"), "--dry-run")
    assert "optimizes no uprobe" in text.out + text.err


def test_kernel_flag_skips_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def never() -> int | None:
        raise AssertionError("the running kernel was asked")

    monkeypatch.setattr(kmod, "uprobe_syscall_errno", never)
    _rc, doc, _ = _rewrite(tmp_path, "--kernel", "nop10-series")
    assert doc["form"] == "combo10" and "form-chosen" in _codes(doc)
    _rc, doc, _ = _rewrite(tmp_path / "x", "--form", "nop5")
    assert doc["form"] == "nop5" and "form-chosen" not in _codes(doc)


def test_api_accepts_auto_and_refuses_unknown_values(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kmod, "uprobe_syscall_errno", lambda: errno.EPROTO)
    o = api.rewrite(fixture("pie"), tmp_path / "a", form="auto")
    assert o.form is Form.COMBO10 and o.changed
    assert api.rewrite_plan(fixture("pie"), form="auto").form is Form.COMBO10
    with pytest.raises(ValueError, match="form"):
        api.rewrite(fixture("pie"), tmp_path / "b", form="nop7")
    with pytest.raises(ValueError, match="kernel"):
        api.rewrite(fixture("pie"), tmp_path / "c", kernel="5.10")
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
