"""The core's usage error: what it raises where the CLI used to get click's.

``UsageError``: settings that cannot work as given (a flag that needs another, a spec that names nothing
usable). The core never raises click's exceptions (it is a library too); ``retrctl.cli`` shows this one exactly
as click shows a usage error (the command's usage line, the help hint, "Error: …") and exits 2. Bad input files
are ``retrctl.records.RecordError`` (exit 2), a locked output ``records.BusyError`` (exit 75).
"""

from __future__ import annotations


class UsageError(ValueError):
    """Flags or arguments that cannot work as given; the message names the flag."""
