"""Errors for bad input files: each names the file, the row and the field."""

from __future__ import annotations


class InputFileError(ValueError):
    """A file the user handed us is wrong; the message says where.

    ``row`` is the 0-based data row (header excluded) as pandas numbers it, or
    None when the problem concerns the whole file (a missing column, say).
    """

    def __init__(self, path, row, field, problem: str):
        self.path = str(path) if path is not None else "<in-memory table>"
        self.row = row
        self.field = field
        self.problem = problem
        where = [f"file {self.path}"]
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{', '.join(where)}: {problem}")
