"""Kernel write sequences for uprobe sites (every kernel generation),
trampoline placement."""
