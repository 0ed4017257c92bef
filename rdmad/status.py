"""What the agent tells the world: per-object status, config errors, bounded history,
and the plan of its latest pass.

The agent is the only writer (``publish``, ``record``, ``publish_plan``); readers
(sd_notify STATUS=, the API, metrics, tests) hold a ``StatusView`` and never see the
agent itself. Snapshots are immutable, so a reader never observes a half-updated
status. Readers that want to hear of changes ``subscribe`` a callback: it runs on
the loop, right after the change, and must only hand the change on (put it in a
bounded queue, bump a counter); one that raises is dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import msgspec
import structlog

from rdmad.model import (
    Action,
    NodeState,
    ObjectDetail,
    ObjectState,
    ObjectStatus,
    PauseObserved,
    Verdict,
    node_verdict,
)
from rdmad.model.status import worst_object
from rdmad.text import safe

log = structlog.get_logger("rdmad.status")

HISTORY_LIMIT = 200
API_VERSION = 1  # the version of docs/API.md's documents ("api" in each)


class ObjectReport(msgspec.Struct, frozen=True):
    obj: str
    state: ObjectState
    message: str = ""
    last_error: str | None = None  # the most recent failure, kept after recovery is pending
    failures: int = 0  # consecutive failures
    retry_at: float | None = None  # wall time of the next attempt while degraded
    errno: int | None = None  # the kernel's errno of last_error, when it gave one
    # {"at", "what", "reason", "cause"} of the last change applied to it (state.applied)
    last_change: dict[str, Any] | None = None
    detail: ObjectDetail | None = None  # per attribute and per VF; None before a pass


class HistoryEntry(msgspec.Struct, frozen=True):
    """One thing that happened: a kernel change (or attempt), a start, a reload.

    ``event``: applied, failed, recorded (dry run), start, config-reloaded,
    config-invalid, state-rebuilt, degraded, recovered.
    ``cause``: why the pass ran: boot, restart, first-start, driver-reload, or the
    trigger sources (udev, netlink, drift, sighup, api, retry ...); "... (planned
    ahead)": applied as the event came, from the plan the pass before made for it.
    """

    at: float  # wall time
    event: str
    obj: str = ""
    what: str = ""
    reason: str = ""
    cause: str = ""
    error: str | None = None
    errno: int | None = None  # the kernel's errno when ``error`` came from a kernel write
    kind: str = ""  # the action kind (set-numvfs, set-vf, add-rxe ...) for applied/failed

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "event": self.event,
            "obj": self.obj,
            "what": self.what,
            "reason": self.reason,
            "cause": self.cause,
            "error": self.error,
            "errno": self.errno,
            "kind": self.kind,
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
            errno=data["errno"] if isinstance(data.get("errno"), int) else None,
            kind=str(data.get("kind", "")),
        )


class PlanReport(msgspec.Struct, frozen=True):
    """What one pass planned, before applying it (or, for a plan-only request, instead).

    ``answered``: the trigger count the pass answered (see ``TriggerQueue.put``), so
    a reader that asked for a plan knows this one was made after its request.
    """

    at: float  # wall time the plan was made
    cause: str
    actions: tuple[Action, ...]
    objects: tuple[ObjectStatus, ...]
    dry_run: bool = False
    answered: int = 0

    def to_json(self, source: str) -> dict[str, Any]:
        """docs/API.md's plan document: ``GET /v1/plan`` (source "daemon") and `rdmad
        plan --json` (source "local", which adds what it planned from) use this one
        builder, so both say obj/describe/reason with the same meaning."""
        return {
            "api": API_VERSION,
            "source": source,
            "at": self.at,
            "cause": self.cause,
            "dry_run": self.dry_run,
            "actions": [
                {
                    "obj": a.obj,
                    "kind": a.kind,
                    "describe": a.describe(),
                    "reason": a.reason,
                    "changes_kernel": a.changes_kernel,
                }
                for a in self.actions
            ],
            "objects": [
                {"obj": s.obj, "state": s.state.value, "reason": s.message} for s in self.objects
            ],
        }


class StatusSnapshot(msgspec.Struct, frozen=True):
    objects: tuple[ObjectReport, ...] = ()
    config_errors: tuple[str, ...] = ()
    config_files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # observe notes, state-file problems, event sources down
    passes: int = 0
    last_pass_at: float | None = None  # wall time the last pass finished
    last_pass_seconds: float | None = None
    last_cause: str = ""
    # The last pass observed the kernel and planned (False: observe() or plan() failed,
    # and ``objects`` are those of the pass before).
    last_pass_ok: bool = True
    # Why passes fail, while they do ("observing the kernel failed: [Errno 24] ..., 3
    # passes in a row"); None once a pass worked.
    pass_error: str | None = None
    ready: bool = False
    dry_run: bool = False
    start_kind: str = ""  # boot, restart, first-start
    boot_id: str = ""
    pending_actions: tuple[str, ...] = ()  # what a dry run would do / what is still to do
    config_ok: bool = True  # a valid config was loaded at least once
    answered: int = 0  # triggers answered by the passes so far (TriggerQueue.put's count)
    pause: PauseObserved | None = None  # a guarded stop in progress: rdmad stands back

    def count(self, state: ObjectState) -> int:
        return sum(1 for o in self.objects if o.state is state)

    def verdict(self) -> Verdict:
        """converged / not converged / degraded / starting, and why (rdmad.model.status)."""
        return node_verdict(
            self._statuses(),
            passes=self.passes,
            config_errors=len(self.config_errors),
            pass_error=self.pass_error,
        )

    @property
    def converged(self) -> bool:
        return self.verdict().converged

    def _statuses(self) -> list[ObjectStatus]:
        """Each object's state and reason (its last error while it has one)."""
        return [ObjectStatus(o.obj, o.state, o.last_error or o.message) for o in self.objects]

    def _tally(self) -> str:
        """ "3 object(s), 2 converged, 1 blocked; OBJ: why" (the most urgent object's why)."""
        if not self.objects:
            return "nothing declared"
        parts = [f"{len(self.objects)} object(s)"]
        parts += [
            f"{self.count(state)} {state.value}" for state in ObjectState if self.count(state)
        ]
        tally = ", ".join(parts)
        worst = worst_object(self._statuses())
        return tally if worst is None else f"{tally}; {worst.obj}: {worst.message}"

    def summary(self) -> str:
        """One line for sd_notify STATUS= and logs: the verdict first, unless the tally
        says it alone (every object converged, or nothing declared). Escaped
        (rdmad.text): it quotes names and holders, and a newline in STATUS= would be a
        second sd_notify assignment."""
        verdict = self.verdict()
        if verdict.state is NodeState.STARTING:
            head = "starting: first reconcile pass"
        elif verdict.state is NodeState.DEGRADED and self.pass_error is not None:
            head = f"DEGRADED: {verdict.reason}; the last pass that worked: {self._tally()}"
        else:
            head = self._tally()
            if verdict.state is NodeState.DEGRADED:
                head = f"DEGRADED: {head}"
            elif verdict.state is NodeState.NOT_CONVERGED:
                head = f"NOT converged: {head}"
            elif self.count(ObjectState.CONVERGED) != len(self.objects):
                head = f"converged: {head}"  # e.g. an attribute its driver refuses
        if self.config_errors:
            kept = "last good kept" if self.config_ok else "no valid config yet: nothing managed"
            head += f"; config invalid ({len(self.config_errors)} error(s)), {kept}"
        if self.dry_run:
            head = "dry run: " + head
        return safe(head)[:400]


# A change as subscribers hear it: ("status", StatusSnapshot), ("history", HistoryEntry)
# or ("plan", PlanReport).
Change = tuple[str, Any]
Listener = Callable[[Change], None]


class StatusView(Protocol):
    """What readers get: no way to change anything."""

    @property
    def current(self) -> StatusSnapshot: ...

    @property
    def plan(self) -> PlanReport | None: ...

    def history(self, limit: int | None = None) -> list[HistoryEntry]: ...

    def subscribe(self, listener: Listener) -> None: ...

    def unsubscribe(self, listener: Listener) -> None: ...


class StatusStore:
    def __init__(self, limit: int = HISTORY_LIMIT) -> None:
        self._current = StatusSnapshot()
        self._plan: PlanReport | None = None
        self._history: deque[HistoryEntry] = deque(maxlen=limit)
        self._listeners: list[Listener] = []
        self.version = 0  # bumps on every publish/record: cheap change detection

    @property
    def current(self) -> StatusSnapshot:
        return self._current

    @property
    def plan(self) -> PlanReport | None:
        """The plan of the latest pass (or plan-only request)."""
        return self._plan

    def history(self, limit: int | None = None) -> list[HistoryEntry]:
        items = list(self._history)
        return items if limit is None else items[-limit:]

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def restore(self, entries: Iterable[HistoryEntry]) -> None:
        """History kept from before this start (the state file): readers see it in
        ``history()``, listeners are not told: it is not news (metrics would count
        a previous run's actions again)."""
        self._history.extend(entries)
        self.version += 1

    def publish(self, snapshot: StatusSnapshot) -> None:
        self._current = snapshot
        self.version += 1
        self._tell(("status", snapshot))

    def publish_plan(self, report: PlanReport) -> None:
        self._plan = report
        self.version += 1
        self._tell(("plan", report))

    def record(self, entries: Iterable[HistoryEntry]) -> None:
        items = list(entries)
        self._history.extend(items)
        self.version += 1
        for entry in items:
            self._tell(("history", entry))

    def _tell(self, change: Change) -> None:
        """Hand a change to every listener; a listener that fails is dropped, never the
        writer (the reconcile loop) that published it."""
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:
                log.exception("status.listener-failed", listener=repr(listener))
                self.unsubscribe(listener)


__all__ = [
    "Change",
    "HistoryEntry",
    "Listener",
    "ObjectReport",
    "PlanReport",
    "StatusSnapshot",
    "StatusStore",
    "StatusView",
]
