"""Probe sites: where each probe is, what its bytes are, and (later) whether it can be optimized."""
