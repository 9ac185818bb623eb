"""Terminal rendering with rich. The only module that imports rich.

Renderers take the same JSON-shaped documents that `--json` prints, so text and JSON outputs
cannot drift apart.
"""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


PIPE_WIDTH = 160  # width when the output is not a terminal (rich would pick 80)


def make_console(file: IO[str] | None = None, width: int | None = None,
                 color: bool | None = None) -> Console:
    """A console for `file`; to a pipe or file it is PIPE_WIDTH wide and has no colour."""
    console = Console(file=file, width=width, highlight=False, soft_wrap=False,
                      color_system=None if color is False else "auto", no_color=color is False)
    if width is None and not console.is_terminal:
        console.width = PIPE_WIDTH
    return console


def _hex(v: int | None) -> str:
    return "-" if v is None else f"{v:#x}"


def render_list(console: Console, doc: dict[str, Any]) -> None:
    for f in doc["files"]:
        elf = f["elf"]
        head = (f"{f['path']}: {f['probe_count']} probe(s), ELF{elf['class']} {elf['byteorder']}"
                f"-endian {elf['machine']}")
        console.print(Text(head, style="bold"))
        if f["probes"]:
            table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
            for col in ("probe", "address", "offset", "semaphore", "site"):
                table.add_column(col, no_wrap=True)
            table.add_column("function", overflow="fold", ratio=1)
            table.add_column("arguments", overflow="fold", ratio=1)
            for p in f["probes"]:
                sem = p["semaphore"]
                sem_text = "-" if sem is None else (
                    f"{_hex(sem['address'])} ({sem['section'] or 'no section'})")
                site = p["site"]["form"]
                if site == "other":
                    site = f"other: {p['site']['disassembly']}"
                table.add_row(f"{p['provider']}:{p['name']}", _hex(p["address"]),
                              _hex(p["file_offset"]), sem_text, site, p["function"] or "-",
                              " ".join(a["raw"] for a in p["arguments"]))
            console.print(table)
        render_findings(console, f["findings"])


def render_findings(console: Console, findings: list[dict[str, str]]) -> None:
    for fd in findings:
        line = Text()
        line.append(f"{fd['severity']}", style=_SEVERITY_STYLE.get(fd["severity"], ""))
        line.append(f" [{fd['code']}]")
        if fd["where"]:
            line.append(f" {fd['where']}:")
        line.append(f" {fd['message']}")
        if fd["hint"]:
            line.append(f" ({fd['hint']})", style="dim")
        console.print(line)
