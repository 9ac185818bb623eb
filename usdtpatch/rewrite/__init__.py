"""Rewriting 1-byte USDT sites of built binaries into 5-byte NOP sites: decide, build, verify,
restore."""
