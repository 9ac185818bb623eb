"""Developer tools run from the Makefile (`make fuzz`); not part of the installed package."""
