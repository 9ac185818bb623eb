"""The prover: a detour shown equivalent to its window for every initial state.

`prove.vex` lifts x86-64 code to VEX IR (the only module that imports pyvex) and turns it into
the plain tuples `prove.smt` executes symbolically with z3 (the only module that imports
z3-solver); `prove.prover` asks both and caches the answers; `prove.verifier` is the rewrite's
verifier: the proof first, the emulator (usdtpatch.verification.equivalence) where there is none;
`prove.support` says cheaply, without either engine, whether a window's instructions are ones
the prover models. docs/rewrite.md ("Proved, not sampled") says what is proved and assumed.
"""
