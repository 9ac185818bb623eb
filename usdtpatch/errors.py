"""The one exception tree of usdtpatch.

Exceptions are for input the tool cannot use at all (not an ELF file, a truncated header, an
unreadable path). A problem with one probe site is a `Finding` (usdtpatch.findings),
never an exception. `cli.main` turns every `UsdtpatchError` into one line on stderr and exit 2.
"""


class UsdtpatchError(Exception):
    """Base of every error usdtpatch raises on purpose."""


class InputError(UsdtpatchError):
    """A file cannot be read (missing, a directory, permission denied)."""


class ElfFormatError(UsdtpatchError):
    """The bytes are not a well-formed ELF file; the message says where and what was found."""


class UnsupportedError(UsdtpatchError):
    """A well-formed input the requested operation does not handle (e.g. big-endian code)."""


class OutputError(UsdtpatchError):
    """An output file cannot be written; nothing was left half-written."""
