"""`usdtpatch post-link FILE [-o OUT] [--check-only] ...`: the build step (integrate.step)."""

from usdtpatch.integrate.step import register, run

__all__ = ["register", "run"]
