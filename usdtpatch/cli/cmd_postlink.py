"""`usdtpatch post-link FILE [-o OUT] [--check-only] ...`: the build step (usdtpatch.build.step)."""

from usdtpatch.build.step import register, run

__all__ = ["register", "run"]
