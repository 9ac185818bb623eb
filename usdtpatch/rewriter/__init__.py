"""Rewriting 1-byte USDT sites of built binaries into 5-byte NOP sites.

plan.py decides every site (frozen `RewritePlan`), build.py makes the file from a plan,
marker.py restores the original from the marker (`restore_image`; the marker itself is
usdtpatch.elf.marker's), forms.py the site forms and guards, report.py the JSON entry.
`usdtpatch.api.rewrite` is the entry point for files.
"""
