"""The one error a refused file or output path becomes, and the internal refusal the checks raise."""

from __future__ import annotations

import os


class ProgramFileError(Exception):
    """A file strideguard cannot or will not read or write; the message names it and says why, on one line."""

    speaks_for_itself = True
    """Its message is already the user's words: ``prove.isolation`` hands it back from a child as it is."""

    def __init__(self, path: os.PathLike | str, problem: str):
        self.path = os.fspath(path)
        self.problem = one_line(problem.strip())
        super().__init__(f"{shown_path(self.path)}: {self.problem}")


class Refused(Exception):
    """Raised by a check deep inside a file; ``load_program`` turns it into a ``ProgramFileError`` naming the file."""


def shown_path(path: str) -> str:
    """A path as printed in an error: as typed, unless it holds characters that would break the line."""
    return path if path.isprintable() else repr(path)


def one_line(text: str) -> str:
    """``text`` with any line break or control character made visible, so that an error stays one line."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def excerpt(text: str, limit: int = 60) -> str:
    """A value from a file, quoted and cut short, safe to print on one line."""
    shown = repr(text[:limit])
    return shown if len(text) <= limit else shown + "..."


def shown(text: str, limit: int = 60) -> str:
    """A value from a file as it is when it is short and printable, else quoted and cut short."""
    return text if len(text) <= limit and text.isprintable() and text.strip() == text else excerpt(text, limit)
