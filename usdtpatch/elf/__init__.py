"""The ELF model: bytes in, frozen dataclasses out (headers, notes, argument specs, symbols)."""
