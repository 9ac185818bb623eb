"""x86 knowledge: NOP and site forms (data), decoding for analysis (capstone)."""
