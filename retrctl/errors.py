"""The core's errors, one module so every other module can import them and ``retrctl.cli`` maps each, once.

- ``RecordError``: bad input (exit status 2, one line naming file, line and field).
- ``BusyError``: an output another process holds the lock of (exit status 75, EX_TEMPFAIL).
- ``UsageError``: settings that cannot work as given (a flag that needs another, a spec that names nothing usable,
  a training step that fits no memory setting). The core never raises click's exceptions (it is a library too);
  ``retrctl.cli`` shows this one exactly as click shows a usage error (the command's usage line, the help hint,
  "Error: …") and exits 2.
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


class UsageError(ValueError):
    """Flags or arguments that cannot work as given; the message names the flag."""
