"""The one home of usdtpatch's documents and their renderings.

Every versioned document (list, check, show, rewrite, plan, verify, kcheck, bench, the build
report) is made here from the library's frozen results, with one envelope (envelope.py), and
rendered here: text (plain.py's tables, on a terminal too; render.py with rich for what plain
text cannot lay out: show, bench and the progress bar; text.py choosing), JSON, SARIF
(sarif.py) and HTML (html.py). Nothing below the library imports this package; the command
line and the build integration call the library, then a function here.
"""
