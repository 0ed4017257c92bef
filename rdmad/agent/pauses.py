"""Pauses and resumes in the history, from the pause file each observation reads.

A pause is written by another process (the guard inside `modprobe -r`, openibd's
stop, the API), so the agent learns of it from observations: a pause seen for the
first time is a ``paused`` entry (who asked, why, for how long, which modules end
it), its end a ``resumed`` entry (after how long, why: it ran out, a module is loaded
again, the unload failed, ``rdmad-ctl resume``). Each entry carries the pause's own
times (``at`` = when it began / ended), so a pause that began and ended between two
passes (a failed unload) is told as it happened. ``cause`` is who asked.

A pause is known by (who asked, when it began); the last ``paused`` entry of the
history kept across a restart says which pause was already told.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from rdmad.model.observed import PauseObserved
from rdmad.status import HistoryEntry

log = structlog.get_logger("rdmad.agent")

PAUSED, RESUMED = "paused", "resumed"


class PauseHistory:
    def __init__(self, earlier: Iterable[HistoryEntry] = ()) -> None:
        self._told: tuple[str, float] | None = None  # the last pause told as begun
        self._open: PauseObserved | None = None  # told as begun, not yet as ended
        for entry in earlier:  # a restart: what the run before told
            if entry.event == PAUSED:
                self._told = (entry.cause, entry.at)
                self._open = PauseObserved(entry.cause, entry.reason, entry.at, entry.at)
            elif entry.event == RESUMED and self._open is not None and entry.cause == self._open.by:
                self._open = None

    def seen(self, pause: PauseObserved | None, now: float) -> list[HistoryEntry]:
        """The entries an observation's pause record adds (``now``: wall time)."""
        out: list[HistoryEntry] = []
        if pause is None:
            if self._open is not None:
                out.append(_resumed(self._open, now, "the pause file is gone"))
                self._open = None
            return out
        key = (pause.by, pause.since)
        if key != self._told:
            if self._open is not None:
                out.append(_resumed(self._open, pause.since, f"replaced by a pause by {pause.by}"))
            out.append(_paused(pause))
            self._told, self._open = key, pause
        if self._open is not None and pause.ended_why is not None:
            out.append(_resumed(pause, pause.ended_at or now, pause.ended_why))
            self._open = None
        return out


def _paused(p: PauseObserved) -> HistoryEntry:
    seconds = p.until - p.since
    back = f", or until {' or '.join(p.modules)} is loaded again" if p.modules else ""
    log.info("pause.began", by=p.by, reason=p.reason, seconds=round(seconds), modules=p.modules)
    return HistoryEntry(
        p.since,
        PAUSED,
        what=f"no module loads, no rxe links: for at most {seconds:.0f} s{back}",
        reason=p.reason,
        cause=p.by,
    )


def _resumed(p: PauseObserved, at: float, why: str) -> HistoryEntry:
    after = max(0.0, at - p.since)
    log.info("pause.ended", by=p.by, after_seconds=round(after, 1), why=why)
    return HistoryEntry(
        at,
        RESUMED,
        what=f"after {after:.1f} s: {why}",
        reason=why,
        cause=p.by,
    )
