"""What the cluster already did is recorded before anything new is decided.

A launch, a stop asked for, or a run's end whose write the state file refuses
(`StoreWriteError`: its disk full, a lock someone else holds) is kept, in order, and written
first at the next tick; until it is, a tick decides nothing. Otherwise a launch whose record
failed leaves its job QUEUED beside its live run (and the next tick launches it a second time
into the same run directory), and a run whose end failed to record leaves its job RUNNING for
good.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("tidal.scheduler")


class Recorder:
    """The writes the state file refused, oldest first (`pending`)."""

    def __init__(self, note: Callable[[str], None]) -> None:
        self.note = note  # the scheduler's event log
        self.pending: list[tuple[str, Callable[[], object]]] = []

    def write(self, what: str, write: Callable[[], object]) -> bool:
        """Write what the cluster already did (a run launched, a stop asked for, a run's end).
        If the state file refuses it (`StoreWriteError`, or `OSError` writing a curve: a full
        disk, a lock held elsewhere), keep it, in order, for `flush` to write first at each
        tick, and return False; until then no tick decides anything (this module's docstring)."""
        if not self.pending:
            try:
                write()
                return True
            except OSError as e:
                self.note(f"could not record {what} ({e}); written at a later tick, and nothing new "
                          "is decided until it is")
        self.pending.append((what, write))
        return False

    def flush(self) -> bool:
        """Write what `write` kept, oldest first; False while the state file still refuses."""
        while self.pending:
            what, write = self.pending[0]
            try:
                write()
            except OSError:
                return False
            except Exception:  # not the storage: a bug must not hold every later decision back
                log.exception("recording %s failed; dropped", what)
            self.pending.pop(0)
            self.note(f"recorded {what}")
        return True
