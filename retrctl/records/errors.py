"""The errors every reader and writer raises, in a module of their own so every other module can import them.

RecordError is bad input (exit status 2, one line naming file, line and field); BusyError is an output another
process holds the lock of (exit status 75, EX_TEMPFAIL). ``retrctl.cli`` maps them to those exit statuses.
"""

from __future__ import annotations


class RecordError(Exception):
    """Bad input: carries the file, the line (or Parquet row) and the field it concerns."""

    def __init__(self, path, line=None, field=None, message=""):
        self.path, self.line, self.field, self.message = str(path), line, field, message
        super().__init__(str(self))

    def __str__(self):
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        what = f"field '{self.field}': {self.message}" if self.field else self.message
        return f"{where}: {what}"


class BusyError(Exception):
    """An output another process is writing right now (its lock is held): try again later (exit 75, EX_TEMPFAIL)."""
