"""usdtpatch: read, check and rewrite USDT probe sites for Linux optimized uprobes."""

__version__ = "0.1.0"
