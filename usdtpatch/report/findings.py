"""Findings: a problem or fact about a probe, a note or a file, as data.

A finding is not an exception: it goes into the report and the run goes on. Each has a
stable kebab-case `code` (documented in docs/findings.md), a severity, a message that shows
the bad value, and a hint that says what to do about it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Severity(Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return {"info": 0, "warning": 1, "error": 2}[self.value]


@dataclass(frozen=True, slots=True)
class Finding:
    code: str
    severity: Severity
    message: str
    hint: str = ""
    where: str = ""  # e.g. "python:audit" or ".note.stapsdt+0x1c4"

    def to_json(self) -> dict[str, str]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "where": self.where,
            "message": self.message,
            "hint": self.hint,
        }
