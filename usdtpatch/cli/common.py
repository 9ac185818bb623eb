"""What several subcommands share: exit codes, error lines, the signals that stop a command
as Ctrl-C does."""

from __future__ import annotations

from usdtpatch.api import UsdtpatchError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`list` does not)
if TYPE_CHECKING:
    from typing import IO

__all__ = [
    "EXIT_FAIL",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PIPE_CLOSED",
    "EXIT_UNUSABLE",
    "Terminated",
    "error_line",
    "printable",
    "raise_terminated",
]

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_UNUSABLE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: what a reader that stopped early (`| head`) sees of
# any program its pipe's closing ended; quietly, without a line


# control characters (C0, DEL, C1) and the other characters str.splitlines breaks at
_UNPRINTABLE = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_UNPRINTABLE.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def printable(text: str) -> str:
    """`text` with every character that would break the line or drive the terminal (a file's
    note strings can hold any byte) written as an escape: one line, shown as is."""
    return text.translate(_UNPRINTABLE)


def error_line(path: str, exc: UsdtpatchError, err: IO[str]) -> None:
    """One line on stderr naming the file once."""
    text = str(exc)
    line = f"usdtpatch: {text}" if text.startswith(path) else f"usdtpatch: {path}: {text}"
    print(printable(line), file=err)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C's KeyboardInterrupt: the same cleanup runs (a
    temporary output removed, workers stopped; for kcheck the started command killed by pid, a
    --pid process detached, every probe closed) instead of the process ending where it
    stands; exit 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.exit_status = 128 + signum


def raise_terminated(signum: int, _frame: object) -> None:
    """The handler of SIGTERM and SIGHUP while a command runs."""
    raise Terminated(signum)
