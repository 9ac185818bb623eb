"""Function bounds of a code address: the FDE that covers it, else the symbol that holds it.

References: LSB Core "Exception Frames" (an FDE's [pc_begin, pc_begin + pc_range) is one
function or one part of one: GCC gives a split-off `.cold` part its own FDE) and the gABI
symbol table (STT_FUNC st_value/st_size). FDEs come first because they survive stripping and
describe exactly the bytes the unwinder believes belong to the function.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from usdtpatch.elf.cfi import CfiError, CfiIndex, Fde
from usdtpatch.elf.symbols import SymbolTable

MAX_UNSIZED_SYMBOL = 1 << 16  # an unsized symbol ends at the next one, but never beyond this


@dataclass(frozen=True, slots=True)
class FunctionBounds:
    """[start, end) of the function (or function part) holding an address."""

    start: int
    end: int
    source: str  # "fde" or "symbol"
    name: str | None  # the symbol at `start` (mangled), if any
    fde: Fde | None

    @property
    def size(self) -> int:
        return self.end - self.start

    def contains(self, address: int) -> bool:
        return self.start <= address < self.end

    @property
    def label(self) -> str:
        return self.name or f"{self.start:#x}"


def function_bounds(address: int, cfi: CfiIndex, symbols: SymbolTable) -> FunctionBounds | None:
    """The bounds of the function holding `address`: FDE first, then symbols; None if neither."""
    try:
        fde = cfi.lookup(address)
    except CfiError:
        fde = None  # a damaged FDE: fall back to the symbols
    if fde is not None:
        name = None
        sym = symbols.lookup(fde.pc_begin)
        if sym is not None and sym[1] == 0:
            name = sym[0].name
        return FunctionBounds(start=fde.pc_begin, end=fde.pc_end, source="fde", name=name, fde=fde)
    sym = symbols.lookup(address)
    if sym is None:
        return None
    fn = sym[0]
    end = fn.address + fn.size if fn.size else _next_symbol(symbols, fn.address)
    if end is None or end <= address:
        return None
    return FunctionBounds(start=fn.address, end=end, source="symbol", name=fn.name, fde=None)


def _next_symbol(symbols: SymbolTable, start: int) -> int | None:
    i = bisect_right(symbols.addresses, start)
    if i < len(symbols.addresses):
        return min(symbols.addresses[i], start + MAX_UNSIZED_SYMBOL)
    return None


def symbols_inside(symbols: SymbolTable, start: int, end: int) -> list[int]:
    """Addresses of function symbols strictly inside (start, end): other entry points."""
    lo = bisect_right(symbols.addresses, start)
    hi = bisect_left(symbols.addresses, end)
    return list(symbols.addresses[lo:hi])
