"""probedemo: a C extension with USDT probes (provider "probedemo")."""

from probedemo._probes import checksum

__all__ = ["checksum"]
