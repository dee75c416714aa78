"""The core's errors, one module so every other module can import them and the command line converts each once.

- ``RecordError``: bad input (exit status 2, one line naming file, line and field).
- ``BusyError``: an output another process holds the lock of (exit status 75, EX_TEMPFAIL).
- ``UsageError``: settings that cannot work as given (a flag that needs another, a value a flag cannot take, a
  spec that names nothing usable, a checkpoint made with other settings, a training step that fits no memory
  setting); ``flag`` names the flag when one value is at fault. The core never raises click's exceptions (it is a
  library too): a stage's command (``retrctl.stage.StageCommand``) shows this one exactly as click shows a usage
  error (the command's usage line, the help hint, "Error: …", "Invalid value for '--flag': …" when ``flag`` is
  set) and exits 2.
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
    """Flags or arguments that cannot work as given; the message names the flag, or ``flag`` does (its value is
    then the one at fault)."""

    def __init__(self, message: str, flag: str | None = None):
        super().__init__(message)
        self.flag = flag
