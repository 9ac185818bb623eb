"""Rewriting 1-byte USDT sites of built binaries into 5-byte NOP sites.

plan.py decides every site (frozen `RewritePlan`), build.py makes the file from a plan,
marker.py holds the restore marker and `restore_image`, forms.py the site forms and guards,
report.py the JSON entry; apply.py runs plan + build in one call. `usdtpatch.api.rewrite`
is the entry point for files.
"""
