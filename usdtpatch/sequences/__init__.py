"""Kernel write sequences for uprobe sites (nop5; nop10 experimental), trampoline placement."""
