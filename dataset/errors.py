"""Errors for bad user input: what the user got wrong, said in one line.

Two kinds: :class:`InputFileError` (a file the user handed us; it names the file,
the row and the field) and :class:`InputError` (everything else the user chose: an
option value, a combination of options, a name, a run id). Both are ``ValueError``
subclasses, so callers that catch ``ValueError`` keep working.

The CLI prints these (and the registries' name errors, ``FileExistsError`` and
``FileNotFoundError``) as one red line with exit code 2; any other exception is a
bug and keeps its traceback. So raise one of these only where the fix is in the
user's hands, and a plain ``ValueError`` where the fix is in the code.
"""

from __future__ import annotations


class InputError(ValueError):
    """Raised for bad user input that is not a file problem; the CLI prints it as one line."""


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


def read_table(path, reader, **kwargs):
    """``reader(path, **kwargs)`` (pandas' read_csv / read_parquet) with its failures on
    a bad file (not text, torn, empty, not parquet) turned into one error naming it."""
    try:
        return reader(path, **kwargs)
    except (ValueError, UnicodeError, OSError) as exc:
        if isinstance(exc, (InputError, InputFileError, FileNotFoundError)):
            raise
        raise InputFileError(path, None, None, f"cannot be read ({type(exc).__name__}: "
                                               f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
