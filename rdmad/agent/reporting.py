"""What the agent tells the world: status snapshots, history, log lines, READY/STATUS.

The reporter is the only writer of the ``StatusStore`` that readers (sd_notify,
the API, tests) hold; it never touches the kernel or the plan.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from rdmad.agent.memory import Memory
from rdmad.agent.options import Shared
from rdmad.agent.protocols import Notifier, ResultLike, WriteLike
from rdmad.agent.timers import Expectation
from rdmad.model import (
    Action,
    Blocked,
    InUseDrift,
    ObjectDetail,
    ObjectState,
    Observed,
    Unsupported,
    format_value,
    summarize,
)
from rdmad.reconcile.detail import Describer
from rdmad.state import HISTORY_KEPT
from rdmad.status import HistoryEntry, ObjectReport, PlanReport, StatusSnapshot, StatusStore

log = structlog.get_logger("rdmad.agent")


class Reporter:
    def __init__(self, shared: Shared, status: StatusStore, notifier: Notifier) -> None:
        self.shared = shared
        self.status = status
        self.notifier = notifier
        self.memory: Memory | None = None  # set once both exist (memory records history here)
        self.ready = False
        self.started_at = 0.0
        self.notes: dict[str, str] = {}  # event sources down, observe/plan/status failures
        self._last_status_line = ""
        self._seen: dict[str, tuple[tuple[str, str], ...]] = {}  # obj -> notes logged
        self.answered = 0  # the trigger count the latest pass answered (Batch.through)
        self._describe = Describer()

    # --- history -------------------------------------------------------------------------

    def history(self, *entries: HistoryEntry) -> None:
        self.status.record(entries)
        if self.memory is not None:
            kept = self.memory.state.history
            kept.extend(entries)
            del kept[:-HISTORY_KEPT]

    def record_result(self, action: Action, result: ResultLike, cause: str) -> None:
        """One log event and one history entry per kernel write: old -> new, reason, result."""
        wall = self.shared.clock.wall()
        dry_run = self.shared.options.dry_run
        entries = []
        writes: list[WriteLike | None] = [*result.writes] or [None]
        for w in writes:
            target = w.target if w is not None else action.describe()
            old = w.old if w is not None else None
            new = w.new if w is not None else None
            error = w.error if w is not None else None
            dry = dry_run or (w is not None and w.dry_run)
            if error is None and not result.ok and w is None:
                error_text: str | None = result.note or "failed"
            else:
                error_text = None if error is None else str(error)
            event = "recorded" if dry else ("applied" if error_text is None else "failed")
            err_no = getattr(error, "errno", None)
            fields: dict[str, Any] = dict(
                obj=action.obj,
                target=target,
                old=format_value(old),
                new=format_value(new),
                reason=action.reason,
                cause=cause,
            )
            if dry:
                log.info("kernel.would-change", **fields)
            elif error_text is None:
                log.info("kernel.change", **fields)
            else:
                log.warning("kernel.change-failed", error=error_text, **fields)
            entries.append(
                HistoryEntry(
                    wall,
                    event,
                    obj=action.obj,
                    what=f"{target}: {format_value(old)} -> {format_value(new)}",
                    reason=action.reason,
                    cause=cause,
                    error=error_text,
                    errno=err_no if isinstance(err_no, int) else None,
                    kind=action.kind,
                )
            )
        self.history(*entries)

    def log_notes(self, objects: list[str], actions: list[Action]) -> None:
        """Log why an object is blocked (e.g. the pid holding a VF), drifted while in use
        or refused by its driver: once per change of reason, not every pass."""
        for obj in objects:
            reasons = tuple(
                (a.kind, a.reason)
                for a in actions
                if a.obj == obj and isinstance(a, Blocked | InUseDrift | Unsupported)
            )
            if reasons == self._seen.get(obj, ()):
                continue
            if reasons:
                self._seen[obj] = reasons
                for kind, reason in reasons:
                    log.warning(f"object.{kind}", obj=obj, reason=reason)
            else:
                del self._seen[obj]
                log.info("object.unblocked", obj=obj)

    # --- status ----------------------------------------------------------------------------

    def publish_plan(
        self, objects: list[str], actions: list[Action], cause: str, answered: int
    ) -> None:
        """What this pass is about to do (the API's /v1/plan reads it)."""
        self.status.publish_plan(
            PlanReport(
                at=self.shared.clock.wall(),
                cause=cause,
                actions=tuple(actions),
                objects=tuple(summarize(objects, actions)),
                dry_run=self.shared.options.dry_run,
                answered=answered,
            )
        )

    def publish(
        self,
        objects: list[str],
        observed: Observed | None,
        actions: list[Action],
        expectations: dict[str, Expectation],
    ) -> None:
        """A new status snapshot; a bug in building it must not stop the loop."""
        try:
            self._publish(objects, observed, actions, expectations)
        except Exception as exc:
            log.exception("status.crashed")
            self.notes["status"] = f"internal error building status: {exc}"
            # The last snapshot must not go on saying what it said: this pass's news is
            # lost, so readers are told the node is degraded and why.
            current = self.status.current
            self.status.publish(
                msgspec.structs.replace(
                    current,
                    passes=self.shared.pass_count,
                    last_pass_ok=False,
                    pass_error=self.notes["status"],
                    notes=tuple(dict.fromkeys((*current.notes, self.notes["status"]))),
                )
            )
        else:
            self.notes.pop("status", None)

    def _publish(
        self,
        objects: list[str],
        observed: Observed | None,
        actions: list[Action],
        expectations: dict[str, Expectation],
    ) -> None:
        shared = self.shared
        now = shared.clock.monotonic()
        wall = shared.clock.wall()
        memory = self.memory
        reports: list[ObjectReport] = []
        if observed is not None:
            details = self._details(observed, actions)
            applied = memory.state.applied if memory is not None else {}
            for s in summarize(objects, actions):
                f = shared.backoff.get(s.obj)
                exp = expectations.get(s.obj)
                detail = details.get(s.obj)
                change = _last_change(applied.get(s.obj))
                if f is not None:
                    reports.append(
                        ObjectReport(
                            s.obj,
                            ObjectState.DEGRADED,
                            s.message,
                            last_error=f.error,
                            failures=f.failures,
                            retry_at=wall + max(0.0, f.retry_at - now),
                            errno=f.errno,
                            last_change=change,
                            detail=detail,
                        )
                    )
                elif exp is not None and exp.deadline <= now and s.state is ObjectState.PENDING:
                    msg = f"still waiting for {exp.what} after {shared.options.vf_wait:g} s"
                    reports.append(
                        ObjectReport(
                            s.obj,
                            ObjectState.DEGRADED,
                            msg,
                            last_error=msg,
                            last_change=change,
                            detail=detail,
                        )
                    )
                else:
                    reports.append(
                        ObjectReport(s.obj, s.state, s.message, last_change=change, detail=detail)
                    )
        else:
            reports = list(self.status.current.objects)
        restart = memory.restart_note() if memory is not None else None
        notes = (
            *(observed.notes if observed is not None else ()),
            *(memory.notes if memory is not None else ()),
            *((restart,) if restart is not None else ()),
            *self.notes.values(),
        )
        last = shared.passes[-1] if shared.passes else None
        self.status.publish(
            StatusSnapshot(
                objects=tuple(reports),
                config_errors=memory.config_errors if memory is not None else (),
                config_files=memory.config_files if memory is not None else (),
                config_ok=memory.config_ok if memory is not None else True,
                answered=self.answered,
                notes=tuple(notes),
                passes=shared.pass_count,
                last_pass_at=wall if last is not None else None,
                last_pass_seconds=last.seconds if last is not None else None,
                last_cause=last.cause if last is not None else "",
                # Published without a fresh observation once passes ran: observe or plan failed.
                last_pass_ok=observed is not None or last is None,
                pass_error=None if observed is not None or last is None else self._pass_error(),
                ready=self.ready,
                dry_run=shared.options.dry_run,
                start_kind=memory.start_kind if memory is not None else "",
                boot_id=memory.boot_id if memory is not None else "",
                pending_actions=tuple(
                    f"[{a.obj}] {a.describe()}" for a in actions if a.changes_kernel
                ),
                pause=observed.pause if observed is not None else self.status.current.pause,
            )
        )

    def _pass_error(self) -> str:
        """Why the last pass ended before planning, and for how many passes in a row."""
        backoff = self.shared.backoff
        f = backoff.get("observe") or backoff.get("plan")
        if f is None:
            return "the pass ended before planning"
        return f.error if f.failures < 2 else f"{f.error} ({f.failures} passes in a row)"

    def _details(self, observed: Observed, actions: list[Action]) -> dict[str, ObjectDetail]:
        """Per-VF and per-attribute detail; a bug in it costs the detail, not the status."""
        if self.memory is None:
            return {}
        try:
            details = self._describe(self.memory.desired, observed, actions)
        except Exception as exc:
            log.exception("status.detail-crashed")
            self.notes["detail"] = f"internal error building status detail: {exc}"
            return {}
        self.notes.pop("detail", None)
        return details

    # --- systemd ---------------------------------------------------------------------------

    def notify(self, state: str) -> None:
        self.notifier.notify(state)

    def notify_status(self) -> None:
        line = self.status.current.summary()
        if line != self._last_status_line:
            self._last_status_line = line
            self.notifier.notify(f"STATUS={line}")

    def notify_ready(self) -> None:
        """READY=1 again after RELOADING=1, with the status line."""
        self.notifier.notify("READY=1\nSTATUS=" + self.status.current.summary())

    def set_ready(self, why: str) -> None:
        self.ready = True
        self.status.publish(msgspec.structs.replace(self.status.current, ready=True))
        line = self.status.current.summary()
        self._last_status_line = line
        self.notifier.notify(f"READY=1\nSTATUS={line}")
        log.info(
            "agent.ready",
            why=why,
            seconds=round(self.shared.clock.monotonic() - self.started_at, 3),
            status=line,
        )


def _last_change(applied: dict[str, Any] | None) -> dict[str, Any] | None:
    """The last change applied to an object as status shows it; a copy, so the snapshot
    stays as published. State files written before ``cause`` was kept lack it."""
    if applied is None:
        return None
    return {
        "at": applied.get("at"),
        "what": applied.get("what", ""),
        "reason": applied.get("reason", ""),
        "cause": applied.get("cause", ""),
    }
