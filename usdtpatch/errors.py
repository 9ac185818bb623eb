"""The one exception tree of usdtpatch.

Exceptions are for input the tool cannot use at all (not an ELF file, a truncated header, an
unreadable path). A problem with one probe site is a `Finding` (usdtpatch.findings),
never an exception. `cli.main` turns every `UsdtpatchError` into one line on stderr and exit 2.
"""


class UsdtpatchError(Exception):
    """Base of every error usdtpatch raises on purpose."""

    # an error about a file of its own, which its message names (a protocol file given to
    # `plan`): name_input leaves it as it is
    names_its_file = False

    def detail(self, path: str) -> str:
        """The message without its leading "PATH: ", for a line or field that names `path`
        itself (the library's errors name their input: name_input)."""
        text = str(self)
        return text[len(path) + 2:] if path and text.startswith(f"{path}: ") else text


class InputError(UsdtpatchError):
    """A file cannot be read (missing, a directory, permission denied)."""


class ElfFormatError(UsdtpatchError):
    """The bytes are not a well-formed ELF file; the message says where and what was found."""


class UnsupportedError(UsdtpatchError):
    """A well-formed input the requested operation does not handle (e.g. big-endian code)."""


class DebugOnlyFile(UnsupportedError):
    """A separate debug file (its code is not in it): nothing to check, plan or rewrite; its
    probes are listed. `build_id`: its GNU build-id (the binary it belongs to has the same,
    and a file usdtpatch rewrote from that binary keeps it in its marker), or None."""

    def __init__(self, build_id: str | None) -> None:
        self.build_id = build_id
        of = (f"the debug file of the binary with build-id {build_id}" if build_id else
              "it has no build-id")
        super().__init__(
            f"a separate debug file (objcopy --only-keep-debug: its code sections are NOBITS, "
            f"not in the file): nothing to check or rewrite ({of}; `usdtpatch list` lists "
            f"its probes)")

    def __reduce__(self) -> tuple[object, ...]:  # from a worker process: the same error
        return _debug_only_file, (self.build_id, self.args)


def _debug_only_file(build_id: str | None, args: tuple[object, ...]) -> DebugOnlyFile:
    exc = DebugOnlyFile(build_id)
    exc.args = args
    return exc


class OutputError(UsdtpatchError):
    """An output file cannot be written; nothing was left half-written."""


def name_input(exc: UsdtpatchError, path: str) -> UsdtpatchError:
    """`exc`, its message made to name the input `path` when it does not yet: "PATH: what".
    The library calls it on every error of a function over a file, so that an error read
    without its call (a log line, a list of errors) still says which file it is about. The
    exception keeps its type and attributes; an OutputError, which is about an output and
    names it, and an error about a file of its own (names_its_file) are left as they are."""
    text = str(exc)
    if path and path not in text and not isinstance(exc, OutputError) \
            and not exc.names_its_file:
        exc.args = (f"{path}: {text}",)
    return exc
