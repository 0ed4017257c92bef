"""The agent: one task that observes, plans and applies, driven by coalesced triggers.

    triggers ─→ TriggerQueue ─→ (leading edge + settle) ─→ observe ─→ plan ─→ apply ─→ status, state

* Leading edge: the first trigger on an idle loop starts a pass at once. Triggers
  arriving during a pass or within ``settle`` after it are merged into ONE
  follow-up pass at the end of that window; a burst (many triggers) waits for
  ``settle`` of quiet instead, bounded by ``settle_max`` so an endless stream
  cannot starve the loop.
* After a pass that changed the kernel, a follow-up pass verifies it (bounded
  by ``max_followups``); an action applied successfully that the next pass
  plans again did not take effect and counts as a failure.
* Per-object exponential backoff: a failing object is degraded with its last
  error and retried later; the others keep converging.
* One writer: only ``_pass`` calls ``host.apply``. Everything else (signals,
  event sources, timers, the future API) only puts a ``Trigger`` on the queue.

The host, the event sources, the clock and sd_notify are passed in (Protocols
below), so this module imports nothing from ``rdmad.kernel`` and the tests drive
it with a fake host and a fake clock.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections import deque
from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import structlog

from rdmad.backoff import Backoff
from rdmad.clock import Cancellable, Clock, SystemClock
from rdmad.config import ConfigInvalid, LoadedConfig
from rdmad.model import (
    Action,
    BindVfDriver,
    Blocked,
    Desired,
    InUseDrift,
    LoadModule,
    ObjectState,
    Observed,
    PlanState,
    SetNumVfs,
    SetVfSettings,
    Unsupported,
    UnsupportedKey,
    Waiting,
    action_touches,
    format_value,
    summarize,
)
from rdmad.reconcile import declared_objects, plan
from rdmad.state import HISTORY_KEPT, State, StateStore, start_kind
from rdmad.status import HistoryEntry, ObjectReport, StatusSnapshot, StatusStore
from rdmad.triggers import Batch, Trigger, TriggerQueue

log = structlog.get_logger("rdmad.agent")

# --- what the agent needs from the outside (KernelHost/RecordingHost, sdnotify) --------------


class WriteLike(Protocol):
    """One kernel write as the host reports it (rdmad.kernel.host.WriteRecord)."""

    @property
    def target(self) -> str: ...
    @property
    def old(self) -> object: ...
    @property
    def new(self) -> object: ...
    @property
    def error(self) -> BaseException | None: ...
    @property
    def dry_run(self) -> bool: ...


class ResultLike(Protocol):
    """What became of one action (rdmad.kernel.host.ApplyResult)."""

    @property
    def ok(self) -> bool: ...
    @property
    def writes(self) -> Sequence[WriteLike]: ...
    @property
    def note(self) -> str: ...
    @property
    def stale(self) -> bool: ...  # dropped unapplied: the kernel changed since the plan


class Host(Protocol):
    async def observe(self) -> Observed: ...

    async def apply(self, action: Action) -> ResultLike: ...


class Notifier(Protocol):
    """sd_notify; a no-op outside systemd."""

    def notify(self, state: str) -> None: ...


class NullNotifier:
    def notify(self, state: str) -> None:
        pass


ConfigLoader = Callable[[], LoadedConfig]  # raises ConfigInvalid with every error
Planner = Callable[[Desired, Observed, PlanState], list[Action]]


@dataclass(frozen=True, slots=True)
class AgentOptions:
    settle: float = 0.15
    settle_max: float = 2.0  # a continuous stream of triggers still gets a pass this often
    burst: int = 8  # this many pending triggers make a burst: wait for quiet, not the window
    drift_interval: float = 300.0
    drift_jitter: float = 0.1  # ± fraction, so a fleet does not observe in lockstep
    startup_timeout: float = 30.0  # READY=1 at the latest this long after start
    max_followups: int = 5  # consecutive passes that changed the kernel before giving up
    vf_wait: float = 30.0  # VFs must appear this long after sriov_numvfs was written
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    backoff_jitter: float = 0.1
    watchdog_interval: float | None = None  # seconds between WATCHDOG=1 (half WATCHDOG_USEC)
    action_budget: float = 60.0  # an action running longer means the loop is stuck
    long_action_budget: float = 330.0  # numvfs writes (65 s seen) and modprobe (120 s timeout)
    dry_run: bool = False

    def with_config(self, desired: Desired) -> AgentOptions:
        d = desired.daemon
        return replace(
            self,
            settle=d.settle,
            drift_interval=d.drift_interval,
            startup_timeout=d.startup_timeout,
        )


@dataclass(frozen=True, slots=True)
class PassInfo:
    """One reconcile pass, for tests and the benchmark."""

    started: float  # monotonic
    first_trigger_at: float  # monotonic arrival of the oldest trigger it answers
    triggers: int
    cause: str
    seconds: float
    applied: int
    changed: bool


@dataclass(frozen=True, slots=True)
class _Expectation:
    """The kernel was asked to do something asynchronous (VFs to appear) by ``deadline``."""

    what: str
    deadline: float


class Agent:
    def __init__(
        self,
        host: Host,
        load_config: ConfigLoader,
        *,
        clock: Clock | None = None,
        queue: TriggerQueue | None = None,
        status: StatusStore | None = None,
        state_store: StateStore | None = None,
        notifier: Notifier | None = None,
        sources: Sequence[AsyncIterable[Trigger]] = (),
        boot_id: str = "",
        options: AgentOptions | None = None,
        planner: Planner = plan,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.host = host
        self.load_config = load_config
        self.clock: Clock = clock or SystemClock()
        self.queue = queue or TriggerQueue(self.clock)
        self.status = status or StatusStore()
        self.state_store = state_store
        self.notifier: Notifier = notifier or NullNotifier()
        self.sources = list(sources)
        self.boot_id = boot_id
        self.options = options or AgentOptions()
        self.planner = planner
        self._rng = rng
        o = self.options
        self.backoff = Backoff(o.backoff_base, o.backoff_cap, o.backoff_jitter, rng)

        self.desired = Desired()
        self.config_files: tuple[str, ...] = ()
        self.config_errors: tuple[str, ...] = ()
        self._config_ok = False  # a valid config was loaded at least once
        self.state = State(boot_id=boot_id)
        self.start_kind = ""
        self._state_notes: list[str] = []
        self._source_notes: dict[str, str] = {}

        self.passes: deque[PassInfo] = deque(maxlen=10_000)
        self.ready = False
        self._stopping = False
        self._followups = 0
        self._last_applied: set[tuple[str, str]] = set()  # (obj, describe) fully applied
        self._expect: dict[str, _Expectation] = {}
        self._timers: dict[str, Cancellable] = {}
        self._sleeper: asyncio.Future[None] | None = None
        self._in_flight: tuple[Action, float] | None = None  # action, monotonic start
        self._observing_since: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._last_status_line = ""
        self._blocked_seen: dict[str, tuple[tuple[str, str], ...]] = {}  # obj -> notes logged
        self._failed_what: dict[str, set[str]] = {}  # obj -> actions that failed, in backoff
        # VF attributes the PF driver refused as unsupported; forgotten on a config reload.
        self._unsupported: set[UnsupportedKey] = set()
        self.started_at = 0.0

    # --- the outside world's handles -------------------------------------------------------

    def trigger(
        self,
        source: str,
        detail: str = "",
        *,
        stale: bool = False,
        driver: bool = False,
        touches: frozenset[str] = frozenset(),
    ) -> None:
        self.queue.put(Trigger(source, detail, stale=stale, driver=driver, touches=touches))

    def request_reload(self, source: str = "sighup") -> None:
        self.queue.put(Trigger(source, "re-read config", reload=True))

    def stop(self) -> None:
        """Finish the action in flight, then return from run()."""
        self._stopping = True
        self.queue.wake()
        if self._sleeper is not None and not self._sleeper.done():
            self._sleeper.set_result(None)

    @property
    def stopping(self) -> bool:
        return self._stopping

    # --- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        self._start()
        try:
            while not self._stopping:
                if not await self.queue.wait():
                    continue
                batch = self.queue.take()
                if batch is None or self._stopping:
                    continue
                pass_end = await self._pass(batch)
                await self._settle(pass_end)
        finally:
            self._shutdown()

    def _start(self) -> None:
        now = self.clock.monotonic()
        self.started_at = now
        self._load_state()
        self._reload_config(initial=True)
        self.state.started_at = self.clock.wall()
        self._history(
            HistoryEntry(
                self.clock.wall(),
                "start",
                what=f"rdmad started ({self.start_kind})"
                + (" dry run" if self.options.dry_run else ""),
                cause=self.start_kind,
            )
        )
        self._arm("startup", now + self.options.startup_timeout, self._startup_deadline)
        self._arm_drift()
        if self.options.watchdog_interval:
            self._arm("watchdog", now + self.options.watchdog_interval, self._watchdog_tick)
        loop = asyncio.get_running_loop()
        for source in self.sources:
            self._tasks.append(loop.create_task(self._pump(source)))
        self._publish_safely(None, [])
        self.queue.put(Trigger("startup", self.start_kind))

    def _shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._save_state()
        self.notifier.notify("STOPPING=1")
        log.info("agent.stopped", passes=len(self.passes))

    async def _settle(self, pass_end: float) -> None:
        """Return when the follow-up pass should start, or when the loop is idle again.

        The window is ``settle`` after the pass: what arrives during the pass or in
        it is answered by one follow-up at its end, so a lone event waits at most
        ``settle``. A burst (``burst`` triggers or more pending) instead waits for
        ``settle`` of quiet, bounded by ``settle_max``: a driver reload's hundreds of
        uevents cost a handful of passes, not one per window.
        """
        o = self.options
        while not self._stopping:
            pending = self.queue.pending
            if pending is None:
                if not await self.queue.wait(pass_end + o.settle):
                    return  # idle: the next trigger is a leading edge again
                continue
            due = pass_end + o.settle
            if pending.count >= o.burst:
                due = min(max(due, pending.last_at + o.settle), pending.first_at + o.settle_max)
            if due <= self.clock.monotonic():
                return
            # Sleep without waking per trigger: a burst costs nothing until it is quiet.
            await self._sleep_until(due)

    async def _sleep_until(self, when: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleeper = fut

        def done() -> None:
            if not fut.done():
                fut.set_result(None)

        timer = self.clock.call_at(when, done)
        try:
            await fut
        finally:
            timer.cancel()
            self._sleeper = None

    async def _pump(self, source: AsyncIterable[Trigger]) -> None:
        name = getattr(source, "name", type(source).__name__)
        try:
            async for trig in source:
                self.queue.put(trig)
            why = "ended"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            why = f"failed: {exc}"
            log.error("source.failed", source=name, error=str(exc))
        if self._stopping:
            return
        # Without it only the drift timer notices changes: say so, and look now.
        self._source_notes[name] = f"event source {name} {why}; relying on the drift timer"
        self.queue.put(Trigger("resync", f"{name} {why}", stale=True))

    # --- one pass ------------------------------------------------------------------------------

    async def _pass(self, batch: Batch) -> float:
        """One observe -> plan -> apply pass; returns when it ended (monotonic).

        RELOADING=1 is always answered by READY=1 (or by the first READY=1 when the
        daemon was not ready yet), whatever happens in the pass.
        """
        if batch.reload:
            self.notifier.notify(f"RELOADING=1\nMONOTONIC_USEC={int(self.clock.monotonic() * 1e6)}")
        try:
            return await self._run_pass(batch)
        finally:
            if batch.reload and self.ready:
                self.notifier.notify("READY=1\nSTATUS=" + self.status.current.summary())

    async def _run_pass(self, batch: Batch) -> float:
        clock = self.clock
        started = clock.monotonic()
        cause = self._cause(batch)
        first = not self.passes
        if batch.reload:
            self._reload_config(initial=False)
        self._arm_drift()  # every pass is a full observation: drift counts from here

        self._observing_since = started
        try:
            observed = await self.host.observe()
        except Exception as exc:
            self._observing_since = None
            return self._pass_failed("observe", batch, cause, started, exc)
        self._observing_since = None
        self.backoff.succeed("observe")
        self._source_notes.pop("observe", None)
        self._forget_vanished_rxe(observed)

        try:
            actions = self.planner(self.desired, observed, self._plan_state())
        except Exception as exc:  # a bug in plan(): report it, keep the loop alive
            log.exception("plan.crashed")
            return self._pass_failed("plan", batch, cause, started, exc)
        self.backoff.succeed("plan")
        self._source_notes.pop("plan", None)
        objects = self._objects(actions)
        self._log_notes(objects, actions)

        applied, changed, aborted = await self._apply_all(actions, cause, observed)
        now = clock.monotonic()
        self._update_objects(objects, actions, now)
        seconds = now - started
        self.passes.append(
            PassInfo(started, batch.first_at, batch.count, cause, seconds, applied, changed)
        )
        log.debug(
            "reconcile.pass",
            cause=cause,
            triggers=batch.count,
            actions=len(actions),
            applied=applied,
            seconds=round(seconds, 4),
            latency=round(started - batch.first_at, 4),
        )

        if changed:
            self._followups += 1
            if self._followups <= self.options.max_followups:
                self.queue.put(Trigger("followup", "verify what was applied"))
            else:
                log.warning(
                    "reconcile.not-converging",
                    passes=self._followups,
                    still=[a.describe() for a in actions if a.changes_kernel][:5],
                )
        else:
            self._followups = 0
        self._arm_retry()
        self._arm_expectations()

        resting = not changed and not aborted and not self._expecting(now)
        self._publish_safely(observed, actions)
        if changed or applied or first or batch.reload:
            self._save_state()
        if not self.ready and resting:
            self._set_ready("first reconcile done")
        self._notify_status()
        return clock.monotonic()

    def _plan_state(self) -> PlanState:
        if not self._config_ok:
            return PlanState()  # nothing declared: own nothing, remove nothing
        return PlanState(frozenset(self.state.managed_rxe), frozenset(self._unsupported))

    def _forget_vanished_rxe(self, observed: Observed) -> None:
        """A managed rxe link that is gone is no longer ours: a link someone makes later
        under the same name must never be deleted as rdmad's."""
        present = {link.name for link in observed.rdma_links if link.is_rxe}
        gone = self.state.managed_rxe - present
        if gone:
            log.info("rxe.forgotten", links=sorted(gone))
            self.state.managed_rxe -= gone

    async def _apply_all(
        self, actions: list[Action], cause: str, observed: Observed
    ) -> tuple[int, bool, bool]:
        """Apply in plan order; returns (actions applied, kernel changed, aborted as stale)."""
        held_objs: set[str] = set()  # objects that failed or are held back in this pass
        applied_now: set[tuple[str, str]] = set()
        applied = 0
        changed = False
        aborted = False
        for action in actions:
            if not action.changes_kernel:
                continue
            if self._stopping:
                aborted = True
                break
            obj = action.obj
            pending = self.queue.pending
            if (
                pending is not None
                and pending.stale
                and pending.makes_stale(action_touches(action))
            ):
                # A netdev this action names was renamed or removed after we observed: it
                # may point at the wrong device. Hold its object; the next pass re-observes
                # (resolving by ifindex). Events about other devices do not stop the rest.
                log.info("reconcile.plan-stale", obj=obj, why=", ".join(pending.details[:3]))
                aborted = True
                held_objs.add(obj)
                continue
            now = self.clock.monotonic()
            # Backoff holds back a retry of what failed, not a new situation: a driver
            # reload that zeroed the VFs is answered at once even while an action that
            # failed before waits for its retry. What is held holds its object: the
            # object's later actions depend on it (numvfs 4 -> 0 held means no 0 -> 2).
            held = self.backoff.blocked(obj, now) is not None
            if obj in held_objs or (held and action.describe() in self._failed_what.get(obj, ())):
                held_objs.add(obj)
                continue
            key = (obj, action.describe())
            if key in self._last_applied and not self.options.dry_run:
                self._fail(
                    action,
                    f"{action.describe()}: applied without error, but the kernel "
                    "still shows the old state",
                    cause,
                )
                held_objs.add(obj)
                continue
            result = await self._apply_one(action)
            if result.stale:
                # Re-checked right before a destructive write: the kernel changed (a user
                # appeared, a value moved). Nothing was written; plan again from a new look.
                log.info(
                    "reconcile.action-stale", obj=obj, action=action.describe(), why=result.note
                )
                self._history(
                    HistoryEntry(
                        self.clock.wall(),
                        "stale",
                        obj=obj,
                        what=action.describe(),
                        reason=result.note,
                        cause=cause,
                    )
                )
                held_objs.add(obj)
                aborted = True
                self.queue.put(Trigger("followup", f"re-plan {obj}: {result.note}"))
                continue
            applied += 1
            self._record_result(action, result, cause)
            refused = self._learn_unsupported(action, result, observed)
            if not result.ok and refused < _error_count(result):
                held_objs.add(obj)
                self._fail(action, _result_error(action, result), cause, log_it=False)
                continue
            if self.options.dry_run:
                continue
            changed = True
            applied_now.add(key)
            self._after_success(action)
        self._last_applied = applied_now
        return applied, changed, aborted

    def _learn_unsupported(self, action: Action, result: ResultLike, observed: Observed) -> int:
        """Remember VF attributes the driver refused as unsupported; returns how many.

        They are reported as "unsupported by DRIVER" and not planned again until the
        config or the PF's driver changes, so they neither retry forever nor hold
        READY=1 back. Writes are in the order of ``action.changes`` (one describer).
        """
        if not isinstance(action, SetVfSettings) or len(result.writes) != len(action.changes):
            return 0
        driver = next((pf.driver or "" for pf in observed.pfs if pf.pci == action.pci), "")
        learned = 0
        for change, write in zip(action.changes, result.writes, strict=True):
            code = getattr(write.error, "errno", None)
            if code not in _UNSUPPORTED_ERRNOS:
                continue
            learned += 1
            key = UnsupportedKey(
                action.pci,
                driver,
                change.vf,
                change.attr,
                format_value(change.new),
                str(write.error),
            )
            if key not in self._unsupported:
                self._unsupported.add(key)
                log.warning(
                    "vf.attribute-unsupported",
                    obj=action.obj,
                    vf=change.vf,
                    attr=change.attr,
                    value=format_value(change.new),
                    driver=driver,
                    error=str(write.error),
                )
        return learned

    async def _apply_one(self, action: Action) -> ResultLike:
        self._in_flight = (action, self.clock.monotonic())
        try:
            return await self.host.apply(action)
        except Exception as exc:  # a bug in the host: the object degrades, the loop lives
            log.exception("apply.crashed", obj=action.obj, action=action.describe())
            return _Crashed(exc)
        finally:
            self._in_flight = None

    def _after_success(self, action: Action) -> None:
        kind = action.kind
        if kind == "add-rxe":
            self.state.managed_rxe.add(getattr(action, "name", ""))
        elif kind == "delete-rxe":
            self.state.managed_rxe.discard(getattr(action, "name", ""))
        elif isinstance(action, SetNumVfs) and action.new > 0:
            # VFs appear (and get renamed by udev) after the write returns: their
            # uevents trigger the next passes; this deadline says when to stop waiting.
            self._expect[action.obj] = _Expectation(
                f"{action.new} VFs of {action.pci} to appear after sriov_numvfs -> {action.new}",
                self.clock.monotonic() + self.options.vf_wait,
            )
        self.state.applied[action.obj] = {
            "what": action.describe(),
            "at": self.clock.wall(),
            "reason": action.reason,
        }
        self.state.last_errors.pop(action.obj, None)

    def _record_result(self, action: Action, result: ResultLike, cause: str) -> None:
        """One log event and one history entry per kernel write: old -> new, reason, result."""
        wall = self.clock.wall()
        entries = []
        writes: list[WriteLike | None] = [*result.writes] or [None]
        for w in writes:
            target = w.target if w is not None else action.describe()
            old = w.old if w is not None else None
            new = w.new if w is not None else None
            error = w.error if w is not None else None
            dry = self.options.dry_run or (w is not None and w.dry_run)
            if error is None and not result.ok and w is None:
                error_text: str | None = result.note or "failed"
            else:
                error_text = None if error is None else str(error)
            event = "recorded" if dry else ("applied" if error_text is None else "failed")
            fields = dict(
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
                )
            )
        self._history(*entries)

    def _fail(self, action: Action, error: str, cause: str, log_it: bool = True) -> None:
        self._failed_what.setdefault(action.obj, set()).add(action.describe())
        now = self.clock.monotonic()
        f = self.backoff.fail(action.obj, error, now, self.clock.wall())
        self.state.last_errors[action.obj] = {
            "error": error,
            "at": f.wall,
            "failures": f.failures,
        }
        log.warning(
            "object.degraded",
            obj=action.obj,
            error=error,
            failures=f.failures,
            retry_in=round(f.retry_at - now, 3),
        )
        if log_it:
            self._history(
                HistoryEntry(
                    f.wall,
                    "failed",
                    obj=action.obj,
                    what=action.describe(),
                    reason=action.reason,
                    cause=cause,
                    error=error,
                )
            )

    def _pass_failed(
        self, what: str, batch: Batch, cause: str, started: float, exc: Exception
    ) -> float:
        """Observing failed, or plan() raised: say so in status, retry with backoff."""
        now = self.clock.monotonic()
        words = "observing the kernel failed" if what == "observe" else "internal error in plan()"
        f = self.backoff.fail(what, f"{words}: {exc}", now, self.clock.wall())
        log.error(f"{what}.failed", error=str(exc), failures=f.failures)
        self._source_notes[what] = f.error
        self.passes.append(
            PassInfo(started, batch.first_at, batch.count, cause, now - started, 0, False)
        )
        self._arm_retry()
        self._publish_safely(None, [])
        self._notify_status()
        return now

    def _update_objects(self, objects: list[str], actions: list[Action], now: float) -> None:
        """Converged/blocked/waiting objects forget failures; expectations resolve or expire."""
        for obj in dict.fromkeys([*objects, *self._expect]):
            mine = [a for a in actions if a.obj == obj]
            if not any(a.changes_kernel for a in mine):
                self._failed_what.pop(obj, None)
            if not any(a.changes_kernel for a in mine) and self.backoff.succeed(obj):
                log.info("object.recovered", obj=obj)
                self._history(HistoryEntry(self.clock.wall(), "recovered", obj=obj))
                self.state.last_errors.pop(obj, None)
            settled = not any(isinstance(a, Waiting) or a.changes_kernel for a in mine)
            if obj in self._expect and settled:
                del self._expect[obj]  # what we waited for has appeared (or is moot)

    def _log_notes(self, objects: list[str], actions: list[Action]) -> None:
        """Log why an object is blocked (e.g. the pid holding a VF), drifted while in use
        or refused by its driver: once per change of reason, not every pass."""
        for obj in objects:
            reasons = tuple(
                (a.kind, a.reason)
                for a in actions
                if a.obj == obj and isinstance(a, Blocked | InUseDrift | Unsupported)
            )
            if reasons == self._blocked_seen.get(obj, ()):
                continue
            if reasons:
                self._blocked_seen[obj] = reasons
                for kind, reason in reasons:
                    log.warning(f"object.{kind}", obj=obj, reason=reason)
            else:
                del self._blocked_seen[obj]
                log.info("object.unblocked", obj=obj)

    def _expecting(self, now: float) -> bool:
        return any(e.deadline > now for e in self._expect.values())

    # --- status --------------------------------------------------------------------------------

    def _objects(self, actions: list[Action]) -> list[str]:
        objs = declared_objects(self.desired)
        for a in actions:
            if a.obj not in objs:
                objs.append(a.obj)  # e.g. an undeclared rxe link rdmad created
        return objs

    def _publish(self, observed: Observed | None, actions: list[Action]) -> None:
        now = self.clock.monotonic()
        wall = self.clock.wall()
        reports: list[ObjectReport] = []
        if observed is not None:
            for s in summarize(self._objects(actions), actions):
                f = self.backoff.get(s.obj)
                exp = self._expect.get(s.obj)
                if f is not None:
                    reports.append(
                        ObjectReport(
                            s.obj,
                            ObjectState.DEGRADED,
                            s.message,
                            last_error=f.error,
                            failures=f.failures,
                            retry_at=wall + max(0.0, f.retry_at - now),
                        )
                    )
                elif exp is not None and exp.deadline <= now and s.state is ObjectState.PENDING:
                    msg = f"still waiting for {exp.what} after {self.options.vf_wait:g} s"
                    reports.append(ObjectReport(s.obj, ObjectState.DEGRADED, msg, last_error=msg))
                else:
                    reports.append(ObjectReport(s.obj, s.state, s.message))
        else:
            reports = list(self.status.current.objects)
        notes = (
            *(observed.notes if observed is not None else ()),
            *self._state_notes,
            *self._source_notes.values(),
        )
        last = self.passes[-1] if self.passes else None
        self.status.publish(
            StatusSnapshot(
                objects=tuple(reports),
                config_errors=self.config_errors,
                config_files=self.config_files,
                notes=tuple(notes),
                passes=len(self.passes),
                last_pass_at=wall if last is not None else None,
                last_pass_seconds=last.seconds if last is not None else None,
                last_cause=last.cause if last is not None else "",
                ready=self.ready,
                dry_run=self.options.dry_run,
                start_kind=self.start_kind,
                boot_id=self.boot_id,
                pending_actions=tuple(
                    f"[{a.obj}] {a.describe()}" for a in actions if a.changes_kernel
                ),
            )
        )

    def _publish_safely(self, observed: Observed | None, actions: list[Action]) -> None:
        """Status is for people; a bug in building it must not stop the loop."""
        try:
            self._publish(observed, actions)
        except Exception as exc:
            log.exception("status.crashed")
            self._source_notes["status"] = f"internal error building status: {exc}"
        else:
            self._source_notes.pop("status", None)

    def _notify_status(self) -> None:
        line = self.status.current.summary()
        if line != self._last_status_line:
            self._last_status_line = line
            self.notifier.notify(f"STATUS={line}")

    def _set_ready(self, why: str) -> None:
        self.ready = True
        self.status.publish(replace(self.status.current, ready=True))
        line = self.status.current.summary()
        self._last_status_line = line
        self.notifier.notify(f"READY=1\nSTATUS={line}")
        timer = self._timers.pop("startup", None)
        if timer is not None:
            timer.cancel()
        log.info(
            "agent.ready",
            why=why,
            seconds=round(self.clock.monotonic() - self.started_at, 3),
            status=line,
        )

    def _startup_deadline(self) -> None:
        self._timers.pop("startup", None)
        if not self.ready:
            self._set_ready(f"startup deadline of {self.options.startup_timeout:g} s reached")

    def _history(self, *entries: HistoryEntry) -> None:
        self.status.record(entries)
        self.state.history.extend(entries)
        del self.state.history[:-HISTORY_KEPT]

    # --- config and state ------------------------------------------------------------------

    def _reload_config(self, initial: bool) -> None:
        try:
            loaded = self.load_config()
        except ConfigInvalid as exc:
            self.config_errors = tuple(str(e) for e in exc.errors)
            for err in exc.errors:
                log.error("config.invalid", error=str(err))
            kept = "last good config kept" if self._config_ok else "nothing is managed"
            self._history(
                HistoryEntry(
                    self.clock.wall(),
                    "config-invalid",
                    what=f"{len(exc.errors)} error(s); {kept}",
                    error="; ".join(self.config_errors)[:1000],
                    cause="start" if initial else "reload",
                )
            )
            return
        self.desired = loaded.desired
        self.config_files = loaded.files
        self.config_errors = ()
        self._config_ok = True
        self.options = self.options.with_config(loaded.desired)
        objs = set(declared_objects(loaded.desired)) | {"observe"}
        self.backoff.forget_except(objs)
        self._last_applied.clear()
        self._unsupported.clear()  # a new config may fix what the driver refused
        log.info(
            "config.loaded",
            files=list(loaded.files),
            objects=len(objs) - 1,
            reload=not initial,
        )
        if not initial:
            self._history(
                HistoryEntry(
                    self.clock.wall(),
                    "config-reloaded",
                    what=", ".join(loaded.files) or "no config files",
                    cause="reload",
                )
            )

    def _load_state(self) -> None:
        if self.state_store is None:
            self.start_kind = "unknown (no state dir)"
            return
        previous, problem = self.state_store.load()
        self.start_kind = start_kind(previous, self.boot_id, problem)
        if problem:
            log.warning("state.rebuilt", problem=problem)
            self._state_notes.append(problem)
            self._history(HistoryEntry(self.clock.wall(), "state-rebuilt", error=problem))
        if previous is not None:
            if self.start_kind == "restart":
                # Same boot: links rdmad created are still its own.
                self.state.managed_rxe = set(previous.managed_rxe)
            else:
                # After a reboot nothing rdmad created survives; names may be reused
                # by someone else's links, which rdmad must not delete.
                self.state.managed_rxe = set()
            self.state.applied = previous.applied
            self.state.last_errors = previous.last_errors
            self.status.record(previous.history)
            self.state.history = list(previous.history)

    def _save_state(self) -> None:
        if self.state_store is None or self.options.dry_run:
            return
        problem = self.state_store.save(self.state)
        if problem is not None and problem not in self._state_notes:
            log.warning("state.not-saved", problem=problem)
            self._state_notes.append(problem)

    # --- timers --------------------------------------------------------------------------------

    def _arm(self, name: str, when: float, callback: Callable[[], None]) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        self._timers[name] = self.clock.call_at(when, callback)

    def _arm_drift(self) -> None:
        o = self.options
        spread = o.drift_interval * o.drift_jitter * (2 * self._rng() - 1)
        when = self.clock.monotonic() + o.drift_interval + spread
        self._arm("drift", when, lambda: self.queue.put(Trigger("drift", "periodic check")))

    def _arm_retry(self) -> None:
        when = self.backoff.next_retry()
        if when is None:
            timer = self._timers.pop("retry", None)
            if timer is not None:
                timer.cancel()
            return
        self._arm("retry", when, lambda: self.queue.put(Trigger("retry", "backoff expired")))

    def _arm_expectations(self) -> None:
        now = self.clock.monotonic()
        live = [e.deadline for e in self._expect.values() if e.deadline > now]
        if live:
            self._arm(
                "expect",
                min(live),
                lambda: self.queue.put(Trigger("deadline", "waited for the kernel")),
            )

    # --- watchdog ------------------------------------------------------------------------------

    def healthy(self) -> tuple[bool, str]:
        """Alive unless one action (or an observation) has run past its budget."""
        now = self.clock.monotonic()
        if self._in_flight is not None:
            action, since = self._in_flight
            budget = (
                self.options.long_action_budget
                if isinstance(action, SetNumVfs | LoadModule | BindVfDriver)
                else self.options.action_budget
            )
            if now - since > budget:
                return False, f"{action.describe()} running for {now - since:.0f} s"
        observing = self._observing_since
        if observing is not None and now - observing > self.options.action_budget:
            return False, f"observe running for {now - observing:.0f} s"
        return True, ""

    def _watchdog_tick(self) -> None:
        interval = self.options.watchdog_interval
        if not interval or self._stopping:
            return
        ok, why = self.healthy()
        if ok:
            self.notifier.notify("WATCHDOG=1")
        else:
            # No ping: systemd restarts a loop that is stuck. Say why first.
            log.error("watchdog.withheld", why=why)
        self._arm("watchdog", self.clock.monotonic() + interval, self._watchdog_tick)

    # --- helpers -------------------------------------------------------------------------------

    def _cause(self, batch: Batch) -> str:
        if not self.passes:
            return self.start_kind or "start"
        if batch.driver:
            return "driver-reload"
        return batch.describe()


@dataclass(frozen=True, slots=True)
class _Crashed:
    """The result of an apply() that raised instead of returning a result."""

    exc: BaseException

    @property
    def ok(self) -> bool:
        return False

    @property
    def writes(self) -> Sequence[WriteLike]:
        return ()

    @property
    def note(self) -> str:
        return f"internal error: {type(self.exc).__name__}: {self.exc}"

    @property
    def stale(self) -> bool:
        return False


# Errnos with which drivers refuse a VF attribute they do not implement (LAB.md: igb
# link-state and query_rss EOPNOTSUPP, 802.1ad EPROTONOSUPPORT, rates EINVAL).
_UNSUPPORTED_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.EPROTONOSUPPORT, errno.EINVAL})


def _error_count(result: ResultLike) -> int:
    return sum(1 for w in result.writes if w.error is not None) or (0 if result.ok else 1)


def _result_error(action: Action, result: ResultLike) -> str:
    errors = [str(w.error) for w in result.writes if w.error is not None]
    if errors:
        return "; ".join(errors)
    return result.note or f"{action.describe()} failed"
