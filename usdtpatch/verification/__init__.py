"""The bundled emulator (unicorn) with a model of the kernel, and torn-state verification."""
