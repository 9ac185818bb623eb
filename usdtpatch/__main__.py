"""`python -m usdtpatch`, and the installed `usdtpatch` command (`entry`).

Deferred import: cli/, imported in `entry` with the cyclic collector paused (see there).
"""

import gc
import sys


def entry() -> int:
    """Run the command line once, in a process that ends right after it."""
    # Importing the command line makes thousands of objects and no garbage: the cyclic
    # collector's passes over them are wasted (main() pauses it again while a read-only
    # command runs).
    gc.disable()
    from usdtpatch.cli import main

    gc.enable()
    status = main()
    try:  # what is still buffered: a reader that stopped early is seen here too
        sys.stdout.flush()
    except BrokenPipeError:
        from usdtpatch.cli import pipe_closed

        status = pipe_closed(sys.stdout)
    # The process ends next. Python's shutdown runs the cyclic collector over every object
    # still alive (the modules, the decoder's caches): ~28 ms of libjvm.so's check
    # (docs/performance.md), spent on objects that the exit frees anyway. Frozen objects are
    # left out of those passes. Nothing is lost: stdout and stderr are still flushed, atexit
    # handlers still run, and Python never promised to finalize objects still alive at exit.
    # (cli.main itself does not freeze: tests and programs call it many times in one process.)
    gc.freeze()
    return status


if __name__ == "__main__":
    sys.exit(entry())
