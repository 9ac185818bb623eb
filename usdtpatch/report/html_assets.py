"""The inline style sheet and script of the HTML reports (usdtpatch/report/html.py).

The page is complete without the script: every count, hazard, site and per-site view is in
the markup (per-site views in <details>). The script only adds sorting (click a column
heading), filters (one select per `data-filters` name of a `.sites` list, a text search) and
clicking a segment of a summary bar (or a card of findings on sites) to filter by it. It
fetches nothing and writes nothing but the DOM.
"""

from __future__ import annotations

CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--soft:#f6f8fa;--accent:#0969da;
--optimizable:#1a7f37;--in-place:#4ac26b;--forward:#0969da;--backward:#54aeff;
--blocked:#cf222e;--na:#8c959f;--detour:#0969da;--moved:#54aeff;--skipped:#bf8700;
--failed:#cf222e;--error:#cf222e;--warning:#9a6700;--info:#0969da}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);margin:0;
background:#fff}
main{max-width:1500px;margin:0 auto;padding:1.2em 2em 3em}
header.top{border-bottom:1px solid var(--line);padding-bottom:.6em;margin-bottom:1em}
h1{font-size:1.5em;margin:.2em 0}
h2{font-size:1.25em;margin:0;word-break:break-all}
h3{font-size:1.02em;margin:1.2em 0 .5em}
code,.mono,pre{font-family:ui-monospace,"SFMono-Regular","DejaVu Sans Mono",Menlo,monospace;
font-size:.92em}
.muted{color:var(--muted)}
.meta{color:var(--muted);margin:.2em 0 .8em}
section.file{border:1px solid var(--line);border-radius:8px;padding:1em 1.2em;margin:1.5em 0;
background:#fff}
.overview table,.errors table{border-collapse:collapse;width:100%}
.overview th,.overview td{border-bottom:1px solid var(--line);padding:.35em .5em;
text-align:right;white-space:nowrap}
.overview th:first-child,.overview td:first-child{text-align:left}
.scroll{overflow-x:auto}
.overview th.barcell{text-align:left}
.overview td.barcell{width:22%;min-width:8em}
.overview td:last-child,.overview th:last-child{white-space:normal;text-align:left}
.overview td:first-child{white-space:normal}
.overview tr.total td{font-weight:600;border-top:2px solid var(--line)}
.bar{display:flex;height:22px;border-radius:5px;overflow:hidden;background:var(--soft);
border:1px solid var(--line)}
.bar.mini{height:12px}
.bar span{display:block;min-width:3px;color:#fff;font-size:12px;line-height:22px;
text-align:center;white-space:nowrap;overflow:hidden}
.bar.mini span{font-size:0}
.bar span.empty{flex:1;background:var(--soft);color:var(--muted)}
.js .bar.big span[data-filter-value]{cursor:pointer}
.js .bar.big span[data-filter-value]:hover{filter:brightness(1.12)}
.js .hazards [data-filter-value]{cursor:pointer}
.js .hazards [data-filter-value]:hover{border-color:var(--accent)}
.legend{display:flex;flex-wrap:wrap;gap:.4em 1.6em;margin:.7em 0 0;padding:0;list-style:none}
.legend li{display:flex;align-items:baseline;gap:.4em}
.legend .group{color:var(--muted);font-size:.85em;text-transform:uppercase;letter-spacing:.03em}
.legend b{font-variant-numeric:tabular-nums}
.sw{display:inline-block;width:.8em;height:.8em;border-radius:2px;align-self:center}
.o-optimizable{background:var(--optimizable)}.o-in-place{background:var(--in-place)}
.o-forward{background:var(--forward)}.o-backward{background:var(--backward)}
.o-blocked{background:var(--blocked)}.o-na{background:var(--na)}
.o-detour{background:var(--detour)}.o-moved{background:var(--moved)}
.o-skipped{background:var(--skipped)}.o-failed{background:var(--failed)}
.o-blocked.r1,.o-failed.r1{background:#e5534b}.o-blocked.r2,.o-failed.r2{background:#fa7970}
.o-blocked.r3,.o-failed.r3{background:#a40e26}.o-blocked.r4,.o-failed.r4{background:#ff9492}
.o-skipped.r1{background:#d4a72c}.o-skipped.r2{background:#9a6700}.o-skipped.r3{background:#eac54f}
.kpis{display:flex;flex-wrap:wrap;gap:.6em 2.4em;margin:.2em 0 .7em}
.kpi b{font-size:1.7em;font-variant-numeric:tabular-nums;margin-right:.15em}
.kpi.k-optimizable b{color:var(--optimizable)}.kpi.k-after-rewrite b{color:var(--forward)}
.kpi.k-blocked b{color:var(--blocked)}.kpi.k-na b{color:var(--na)}
.facts{display:flex;flex-wrap:wrap;gap:.3em 2em;margin:.5em 0}
.facts div{white-space:nowrap}
.hazards{list-style:none;margin:.5em 0;padding:0;display:grid;gap:.5em}
.hazard{border:1px solid var(--line);border-left:5px solid var(--info);border-radius:5px;
padding:.5em .8em;background:var(--soft)}
.hazard.error{border-left-color:var(--error);background:#fff5f5}
.hazard.warning{border-left-color:var(--warning);background:#fffbeb}
.hazard .hint{color:var(--muted);margin-top:.2em}
.hazard details.many summary{cursor:pointer;color:var(--accent)}
.hazard details.many ul{margin:.2em 0;padding-left:1.2em}
.hazard .hint::before{content:"Hint: ";font-weight:600}
.sev{display:inline-block;white-space:nowrap;font-size:.78em;font-weight:700;text-transform:uppercase;
padding:0 .45em;border-radius:3px;color:#fff;background:var(--info);margin-right:.4em}
.sev.error{background:var(--error)}.sev.warning{background:var(--warning)}
.tag{display:inline-block;border:1px solid var(--line);border-radius:10px;padding:0 .5em;
margin:0 .25em .15em 0;font-size:.85em;background:#fff;white-space:nowrap}
.tag.guard-on{border-color:var(--optimizable);color:var(--optimizable)}
.tag.guard-off{border-color:var(--error);color:var(--error)}
.none{color:var(--muted);font-style:italic}
.sites .cell .tag{white-space:normal;overflow-wrap:break-word}
.filters{display:flex;flex-wrap:wrap;align-items:center;gap:.5em 1em;margin:.6em 0;
padding:.5em .7em;background:var(--soft);border:1px solid var(--line);border-radius:6px}
.filters label{display:flex;gap:.35em;align-items:center;color:var(--muted)}
.filters select,.filters input{font:inherit;padding:.15em .3em}
.filters .shown{margin-left:auto;color:var(--muted)}
.sites{border:1px solid var(--line);border-radius:6px;overflow-x:auto}
.sites .grid{display:grid;grid-template-columns:var(--cols);gap:0 .8em;align-items:start;
padding:.3em .7em .3em 1.6em}
.sites-head{background:var(--soft);font-weight:600;border-bottom:1px solid var(--line);
position:sticky;top:0;z-index:1}
.sites-head button{font:inherit;font-weight:600;border:0;background:none;padding:0;
cursor:pointer;color:var(--fg);text-align:left}
.sites-head button::after{content:" \\2195";color:#aab}
.sites-head [aria-sort=ascending] button::after{content:" \\25B2";color:var(--accent)}
.sites-head [aria-sort=descending] button::after{content:" \\25BC";color:var(--accent)}
details.site{border-bottom:1px solid #eaeef2}
details.site:last-child{border-bottom:0}
details.site>summary{cursor:pointer;list-style:none;position:relative}
details.site>summary::-webkit-details-marker{display:none}
details.site>summary::before{content:"\\25B8";position:absolute;left:.55em;top:.3em;
color:var(--muted)}
details.site[open]>summary::before{content:"\\25BE"}
details.site>summary:hover{background:#f3f7fd}
details.site[open]>summary{background:#eef4fc}
.cell{min-width:0;overflow-wrap:break-word}
.pill{display:inline-block;border-radius:10px;padding:0 .55em;color:#fff;font-size:.86em;
font-weight:600;white-space:nowrap}
.pill.n-a{background:var(--na)}
.view{padding:.6em 1.2em 1em 1.6em;background:#fbfcfd;border-top:1px dashed var(--line)}
.view h4{margin:.8em 0 .3em;font-size:.95em}
.view ol{margin:.2em 0;padding-left:1.4em}
table.code{border-collapse:collapse;font-family:ui-monospace,"DejaVu Sans Mono",monospace;
font-size:.86em;margin:.3em 0;width:100%}
table.code th,table.code td{padding:.1em .6em;text-align:left;vertical-align:top;
border-bottom:1px solid #eef0f2}
table.code th{font-family:system-ui,sans-serif;background:var(--soft)}
table.code td.note{font-family:system-ui,sans-serif;color:var(--muted);white-space:normal}
table.code td{white-space:pre}
table.code tr.inwin td{background:#fff8c5}
table.code tr.probe td{background:#ffe8a3;font-weight:600}
table.code td.mark{color:var(--error);font-weight:700}
.errors{border:1px solid var(--error);background:#fff5f5;border-radius:6px;padding:.5em 1em}
footer{color:var(--muted);font-size:.85em;margin-top:2em;border-top:1px solid var(--line);
padding-top:.6em}
[hidden]{display:none!important}
@media print{.filters{display:none}details.site>summary::before{content:""}}
"""

# Plain ES2017, no library. Everything it reads is in data- attributes of the markup.
SCRIPT = """
(function () {
  "use strict";
  document.documentElement.classList.add("js");
  function words(v) { return v ? v.split(" ").filter(Boolean) : []; }
  function setup(list) {
    var head = list.querySelector(".sites-head");
    var body = list.querySelector(".sites-body");
    var rows = Array.prototype.slice.call(body.children);
    var names = words(list.dataset.filters);
    var bar = document.createElement("div");
    bar.className = "filters";
    var selects = {};
    names.forEach(function (name) {
      var counts = {};
      rows.forEach(function (r) {
        words(r.getAttribute("data-" + name)).forEach(function (v) {
          counts[v] = (counts[v] || 0) + 1;
        });
      });
      var order = words(list.getAttribute("data-order-" + name));
      var values = Object.keys(counts).sort(function (a, b) {
        var ia = order.indexOf(a), ib = order.indexOf(b);
        if (ia < 0) ia = order.length;
        if (ib < 0) ib = order.length;
        return ia - ib || (a < b ? -1 : a > b ? 1 : 0);
      });
      var label = document.createElement("label");
      label.textContent = list.getAttribute("data-label-" + name) || name;
      var sel = document.createElement("select");
      sel.name = name;
      sel.add(new Option("all (" + rows.length + ")", ""));
      values.forEach(function (v) { sel.add(new Option(v + " (" + counts[v] + ")", v)); });
      sel.addEventListener("change", apply);
      label.appendChild(sel);
      bar.appendChild(label);
      selects[name] = sel;
    });
    var search = document.createElement("input");
    search.type = "search";
    search.placeholder = "search text";
    search.addEventListener("input", apply);
    var sl = document.createElement("label");
    sl.textContent = "find";
    sl.appendChild(search);
    bar.appendChild(sl);
    var shown = document.createElement("span");
    shown.className = "shown";
    bar.appendChild(shown);
    list.parentNode.insertBefore(bar, list);

    function apply() {
      var text = search.value.trim().toLowerCase();
      var n = 0;
      rows.forEach(function (r) {
        var ok = names.every(function (name) {
          var want = selects[name].value;
          return !want || words(r.getAttribute("data-" + name)).indexOf(want) >= 0;
        });
        if (ok && text) {
          ok = r.querySelector("summary").textContent.toLowerCase().indexOf(text) >= 0;
        }
        r.hidden = !ok;
        if (ok) n += 1;
      });
      shown.textContent = "showing " + n + " of " + rows.length;
      list.dataset.shown = String(n);
    }
    list.usdtFilter = function (name, value) {
      if (selects[name]) { selects[name].value = value; apply(); }
    };
    apply();

    var cols = Array.prototype.slice.call(head.querySelectorAll("[data-col]"));
    cols.forEach(function (h) {
      var b = document.createElement("button");
      b.type = "button";
      b.textContent = h.textContent;
      b.title = "sort by " + h.textContent;
      h.textContent = "";
      h.appendChild(b);
      b.addEventListener("click", function () {
        var dir = h.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        cols.forEach(function (c) { c.removeAttribute("aria-sort"); });
        h.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
        sortBy(h.dataset.col, h.dataset.kind, dir);
      });
    });
    function key(r, col, kind) {
      var c = r.querySelector('summary [data-col="' + col + '"]');
      var v = c ? (c.hasAttribute("data-sort") ? c.getAttribute("data-sort") : c.textContent) : "";
      return kind === "num" ? Number(v) : v.toLowerCase();
    }
    function sortBy(col, kind, dir) {
      var keyed = rows.map(function (r, i) { return [key(r, col, kind), i, r]; });
      keyed.sort(function (a, b) {
        return a[0] < b[0] ? -dir : a[0] > b[0] ? dir : a[1] - b[1];
      });
      keyed.forEach(function (k) { body.appendChild(k[2]); });
    }
  }
  Array.prototype.forEach.call(document.querySelectorAll(".sites"), setup);
  Array.prototype.forEach.call(
    document.querySelectorAll(".bar.big [data-filter-value], .hazards [data-filter-value]"),
    function (seg) {
      seg.addEventListener("click", function () {
        var section = seg.closest("section");
        var list = section && section.querySelector(".sites");
        if (list && list.usdtFilter) {
          list.usdtFilter(seg.getAttribute("data-filter"), seg.getAttribute("data-filter-value"));
          list.previousSibling.scrollIntoView({block: "start"});
        }
      });
    });
})();
"""
