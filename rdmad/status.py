"""What the agent tells the world: per-object status, config errors, bounded history.

The agent is the only writer (``publish``, ``record``); readers (sd_notify STATUS=,
the future API, tests) hold a ``StatusView`` and never see the agent itself.
Snapshots are immutable, so a reader never observes a half-updated status.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from rdmad.model import ObjectState

HISTORY_LIMIT = 200


@dataclass(frozen=True, slots=True)
class ObjectReport:
    obj: str
    state: ObjectState
    message: str = ""
    last_error: str | None = None  # the most recent failure, kept after recovery is pending
    failures: int = 0  # consecutive failures
    retry_at: float | None = None  # wall time of the next attempt while degraded


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One thing that happened: a kernel change (or attempt), a start, a reload.

    ``event``: applied, failed, recorded (dry run), start, config-reloaded,
    config-invalid, state-rebuilt, degraded, recovered.
    ``cause``: why the pass ran: boot, restart, first-start, driver-reload, or the
    trigger sources (udev, netlink, drift, sighup, api, retry ...).
    """

    at: float  # wall time
    event: str
    obj: str = ""
    what: str = ""
    reason: str = ""
    cause: str = ""
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "event": self.event,
            "obj": self.obj,
            "what": self.what,
            "reason": self.reason,
            "cause": self.cause,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HistoryEntry:
        return cls(
            at=float(data["at"]),
            event=str(data["event"]),
            obj=str(data.get("obj", "")),
            what=str(data.get("what", "")),
            reason=str(data.get("reason", "")),
            cause=str(data.get("cause", "")),
            error=None if data.get("error") is None else str(data["error"]),
        )


@dataclass(frozen=True, slots=True)
class StatusSnapshot:
    objects: tuple[ObjectReport, ...] = ()
    config_errors: tuple[str, ...] = ()
    config_files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # observe notes, state-file problems, event sources down
    passes: int = 0
    last_pass_at: float | None = None  # wall time the last pass finished
    last_pass_seconds: float | None = None
    last_cause: str = ""
    ready: bool = False
    dry_run: bool = False
    start_kind: str = ""  # boot, restart, first-start
    boot_id: str = ""
    pending_actions: tuple[str, ...] = ()  # what a dry run would do / what is still to do
    config_ok: bool = True  # a valid config was loaded at least once

    def count(self, state: ObjectState) -> int:
        return sum(1 for o in self.objects if o.state is state)

    def summary(self) -> str:
        """One line for sd_notify STATUS= and logs."""
        if self.passes == 0:
            head = "starting: first reconcile pass"
        elif not self.objects:
            head = "nothing declared"
        else:
            parts = [f"{len(self.objects)} object(s)"]
            for state in ObjectState:
                n = self.count(state)
                if n:
                    parts.append(f"{n} {state.value}")
            head = ", ".join(parts)
            worst = next(
                (o for state in _WORST_FIRST for o in self.objects if o.state is state),
                None,
            )
            if worst is not None:
                msg = worst.last_error or worst.message
                head += f"; {worst.obj}: {msg}"
        if self.config_errors:
            kept = "last good kept" if self.config_ok else "no valid config yet: nothing managed"
            head += f"; config invalid ({len(self.config_errors)} error(s)), {kept}"
        if self.dry_run:
            head = "dry run: " + head
        return head[:400]


# Which object's reason the one-line summary names: the most urgent first.
_WORST_FIRST = (
    ObjectState.DEGRADED,
    ObjectState.BLOCKED,
    ObjectState.PENDING,
    ObjectState.DRIFT_IN_USE,
    ObjectState.UNSUPPORTED,
)


class StatusView(Protocol):
    """What readers get: no way to change anything."""

    @property
    def current(self) -> StatusSnapshot: ...

    def history(self, limit: int | None = None) -> list[HistoryEntry]: ...


class StatusStore:
    def __init__(self, limit: int = HISTORY_LIMIT) -> None:
        self._current = StatusSnapshot()
        self._history: deque[HistoryEntry] = deque(maxlen=limit)
        self.version = 0  # bumps on every publish/record: cheap change detection

    @property
    def current(self) -> StatusSnapshot:
        return self._current

    def history(self, limit: int | None = None) -> list[HistoryEntry]:
        items = list(self._history)
        return items if limit is None else items[-limit:]

    def publish(self, snapshot: StatusSnapshot) -> None:
        self._current = snapshot
        self.version += 1

    def record(self, entries: Iterable[HistoryEntry]) -> None:
        self._history.extend(entries)
        self.version += 1


__all__ = [
    "HistoryEntry",
    "ObjectReport",
    "StatusSnapshot",
    "StatusStore",
    "StatusView",
]
