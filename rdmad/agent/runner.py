"""One reconcile pass, and the whole order of one, told here once.

Follow one ``Batch`` (``rdmad.triggers``) from the event to the next pass:

0. Before the pass. An event reader, a timer (``agent.timers``), a signal or the API
   puts a ``Trigger``: ``TriggerQueue.put`` drops address changes nobody watches and
   udevd's echoes of link news already heard, and makes a new netdev nobody awaits lag
   behind the one awaited. If the last pass armed a reflex for this event (step 9),
   the event reader has already sent its rxe add as it read the event, before the
   trigger was put (kernel.events.reflex, asked first through ``FastPath._gate``).
1. Schedule (``agent.loop``): ``Agent.run`` waits on the queue (leading edge, or the
   settle window of ``Agent._settle``), ``queue.take()`` makes the batch and hands it
   to ``PassRunner.run``: RELOADING=1 for a reload, then ``FastPath.reflexes_answered``
   waits for the outcome of every add a reflex sent.
2. ``PassRunner._run``: the config read again (reload), a peermem hold forgotten
   (a module event).
3. React (``FastPath.react``): the reactions the last pass armed are disarmed (the
   queue's awaited netdevs, the host's reflexes); those this batch makes due, and every
   add a reflex already sent, go through ``Applier.apply_all`` on the last pass's
   observation. Link news that comes meanwhile may be taken into the batch first.
4. Observe: narrow (``FastPath.observe``: the host's ``observe_changed`` on the
   batch's link news, then up to MAX_NEWS_FOLDS folds of news that came meanwhile) or,
   when it cannot, full (``Host.observe``; the drift timer counts from it). This
   observation is the check of what step 3 applied. Then vanished rxe claims are
   forgotten, pauses told (``agent.pauses``), the end of a pause armed.
5. Plan: ``planner`` (``reconcile.plan``, pure), then ``Reporter.publish_plan``. A
   plan-only batch (the API's /v1/plan) ends here: nothing applied, nothing disarmed.
6. Re-check and apply, per action and in plan order (``Applier.apply_all``): held if
   an event pending since the observation makes it stale, or by backoff or a module
   settling; then ``Host.apply``, which re-reads the kernel right before each
   destructive write (kernel.apply.recheck) and answers stale if it changed. There is no
   re-check step of its own between plan and apply. What step 3 did is added in.
7. Bookkeeping: objects recovered and expectations met (``_update_objects``), a look
   again at GIDs (``_look_again``), the pass recorded, a follow-up trigger when step
   6 changed the kernel (``_follow_up``; what step 3 changed, step 4 has checked),
   retry and expectation timers.
8. Report (``agent.reporting``): the triggers answered (``batch.through``), status
   published, the state file saved, READY=1 at the first rest, STATUS=.
9. Arm, only at rest (step 6 changed nothing, nothing stale, no expectation) and not in
   a dry run: ``FastPath.arm`` plans ahead (``reconcile.reactions.anticipate``) what the
   awaited events will call for and arms it (step 0 and step 3 of the next pass).
10. READY=1 answers a reload, whatever the pass did (once ready); then the loop's
    ``Agent._settle`` decides when the next batch is taken.

Observing failing or plan() raising ends the pass at ``_failed``: reported, retried
with backoff, never ending the loop; nothing is armed. The fast path (steps 0, 1's
wait, 3, the narrow side of 4 and 9) is one object, ``agent.fastpath.FastPath``: this
module reads react -> observe -> plan -> apply -> bookkeeping -> report -> arm.
"""

from __future__ import annotations

import structlog

from rdmad.agent.applying import Applied, Applier
from rdmad.agent.fastpath import FastPath
from rdmad.agent.memory import Memory
from rdmad.agent.options import AgentOptions, PassInfo, Shared
from rdmad.agent.pauses import PauseHistory
from rdmad.agent.protocols import Host, Planner, Scoped
from rdmad.agent.reporting import Reporter
from rdmad.agent.timers import Timers
from rdmad.model import (
    Action,
    BindVfDriver,
    LoadModule,
    NotServing,
    Observed,
    SetEswitch,
    SetNumVfs,
    Waiting,
)
from rdmad.reconcile import declared_objects, observe_scope
from rdmad.status import HistoryEntry
from rdmad.triggers import Batch, Trigger

log = structlog.get_logger("rdmad.agent")


class PassRunner:
    def __init__(
        self,
        shared: Shared,
        *,
        host: Host,
        planner: Planner,
        memory: Memory,
        reporter: Reporter,
        timers: Timers,
    ) -> None:
        self.shared = shared
        self.host = host
        self.planner = planner
        self.memory = memory
        self.reporter = reporter
        self.timers = timers
        self.applier = Applier(shared, host, memory, reporter, timers)
        self.observing_since: float | None = None
        self.fast = FastPath(
            shared, host=host, memory=memory, applier=self.applier, cause=self._cause
        )
        self._followups = 0
        self._pauses: PauseHistory | None = None  # made from the history the state kept

    async def run(self, batch: Batch) -> float:
        """One pass; returns when it ended (monotonic)."""
        if batch.reload:
            usec = int(self.shared.clock.monotonic() * 1e6)
            self.reporter.notify(f"RELOADING=1\nMONOTONIC_USEC={usec}")
        await self.fast.reflexes_answered()
        try:
            return await self._run(batch)
        finally:
            if batch.reload and self.reporter.ready:
                self.reporter.notify_ready()

    async def _run(self, batch: Batch) -> float:
        shared, memory, reporter, timers = self.shared, self.memory, self.reporter, self.timers
        clock = shared.clock
        started = clock.monotonic()
        cause = self._cause(batch)
        first = not shared.passes
        # The steps are those of the module's docstring.
        if batch.reload:
            self.reload_config(initial=False)
        if batch.driver:
            self.memory.forget_peermem_hold()  # a module came or went: worth one more try
        reacted = await self.fast.react(batch)  # 3. react
        if reacted is not None:
            cause = self._cause(batch)  # it may have taken in news that came meanwhile
        self.observing_since = started  # 4. observe
        try:
            observed, narrow = await self._observe(batch, first)
        except Exception as exc:
            return self._failed("observe", batch, cause, started, exc)
        finally:
            self.observing_since = None
        if narrow:
            cause = self._cause(batch)  # it may have absorbed news that came meanwhile
        observed_at = clock.monotonic()
        self._succeeded("observe")
        memory.forget_vanished_rxe(observed)
        told = self._tell_pauses(observed)
        if not batch.plan_only:
            timers.arm_pause_end(observed.pause.until if observed.pause else None)

        try:  # 5. plan
            actions = self.planner(memory.desired, observed, memory.plan_state())
        except Exception as exc:  # a bug in plan(): report it, keep the loop alive
            log.exception("plan.crashed")
            return self._failed("plan", batch, cause, started, exc)
        self._succeeded("plan")
        planned_at = clock.monotonic()
        objects = self.objects(actions, observed)
        reporter.publish_plan(objects, actions, cause, batch.through)
        if batch.plan_only:
            return clock.monotonic()  # asked for the plan only (the API): apply nothing
        reporter.log_notes(objects, actions)

        # 6. re-check and apply
        done = await self.applier.apply_all(actions, cause, observed, frozenset(batch.touched))
        # What step 3 changed was checked by this pass's observation (step 4): only what
        # the plan applied after it calls for a follow-up, or keeps the pass from rest.
        unchecked = done.changed
        if reacted is not None:
            done = Applied(
                done.count + reacted.count,
                done.changed or reacted.changed,
                done.aborted or reacted.aborted,
            )
        now = clock.monotonic()  # 7. bookkeeping
        self._update_objects(objects, actions)
        self._look_again(actions, batch)
        seconds = now - started
        shared.add_pass(
            PassInfo(started, batch.first_at, batch.count, cause, seconds, done.count, done.changed)
        )
        log.debug(
            "reconcile.pass",
            cause=cause,
            triggers=batch.count,
            actions=len(actions),
            applied=done.count,
            seconds=round(seconds, 4),
            observe=round(observed_at - started, 4),
            plan=round(planned_at - observed_at, 4),
            apply=round(now - planned_at, 4),
            narrow=narrow,
            latency=round(started - batch.first_at, 4),
        )
        self._follow_up(unchecked, actions)
        timers.arm_retry()
        timers.arm_expectations()

        # 8. report
        resting = not unchecked and not done.aborted and not timers.expecting(now)
        reporter.answered = batch.through
        reporter.publish(objects, observed, actions, timers.expectations)
        if done.changed or done.count or first or batch.reload or told:
            memory.save_state()
        if not reporter.ready and resting:
            self.set_ready("first reconcile done")
        reporter.notify_status()
        if resting and not shared.options.dry_run:  # 9. arm
            # Off the event path: the pass has answered. Planned on this observation,
            # which is the node now, as far as events tell (the next batch says the rest).
            self.fast.arm(self.planner, observed, actions)
        return clock.monotonic()

    async def _observe(self, batch: Batch, first: bool) -> tuple[Observed, bool]:
        """Narrow when the fast path can (then True), else everything."""
        observed = await self.fast.observe(batch, first)
        if observed is not None:
            return observed, True
        if not batch.plan_only:
            self.timers.arm_drift()  # a full observation: drift counts from here
        return await self.host.observe(), False

    def reload_config(self, initial: bool) -> None:
        if self.memory.reload_config(initial):
            self.shared.backoff.forget_except(self.memory.objects() | {"observe", "plan"})
            self.applier.last_applied.clear()
        if isinstance(self.host, Scoped):
            self.host.set_scope(observe_scope(self.memory.desired))

    def set_ready(self, why: str) -> None:
        self.timers.cancel("startup")
        self.reporter.set_ready(why)

    def objects(self, actions: list[Action], observed: Observed) -> list[str]:
        objs = declared_objects(self.memory.desired, observed)
        for a in actions:
            if a.obj not in objs:
                objs.append(a.obj)  # e.g. an undeclared rxe link rdmad created
        return objs

    def _follow_up(self, changed: bool, actions: list[Action]) -> None:
        """After a pass that changed the kernel, one more verifies it (bounded)."""
        if not changed:
            self._followups = 0
            return
        self._followups += 1
        if self._followups <= self.shared.options.max_followups:
            # sriov_numvfs returns once the VFs exist: their settings need not wait for
            # the settle window (nor for the burst of uevents the new VFs cause).
            urgent = any(isinstance(a, SetNumVfs) and a.new > a.old for a in actions)
            self.shared.queue.put(Trigger("followup", "verify what was applied", urgent=urgent))
        else:
            log.warning(
                "reconcile.not-converging",
                passes=self._followups,
                still=[a.describe() for a in actions if a.changes_kernel][:5],
            )

    def _succeeded(self, what: str) -> None:
        self.shared.backoff.succeed(what)
        self.reporter.notes.pop(what, None)

    def _failed(self, what: str, batch: Batch, cause: str, started: float, exc: Exception) -> float:
        """Observing failed, or plan() raised: say so in status, retry with backoff."""
        clock = self.shared.clock
        now = clock.monotonic()
        words = "observing the kernel failed" if what == "observe" else "internal error in plan()"
        f = self.shared.backoff.fail(what, f"{words}: {exc}", now, clock.wall())
        log.error(f"{what}.failed", error=str(exc), failures=f.failures)
        self.reporter.notes[what] = f.error
        self.shared.add_pass(
            PassInfo(started, batch.first_at, batch.count, cause, now - started, 0, False)
        )
        self.timers.arm_retry()
        self.reporter.answered = batch.through
        self.reporter.publish([], None, [], self.timers.expectations)
        self.reporter.notify_status()
        return now

    def _update_objects(self, objects: list[str], actions: list[Action]) -> None:
        """Converged/blocked/waiting objects forget failures; expectations resolve or expire."""
        expectations = self.timers.expectations
        failed_what = self.applier.failed_what
        for obj in dict.fromkeys([*objects, *expectations]):
            mine = [a for a in actions if a.obj == obj]
            if not any(a.changes_kernel for a in mine):
                failed_what.pop(obj, None)
                if self.shared.backoff.succeed(obj):
                    log.info("object.recovered", obj=obj)
                    clock = self.shared.clock
                    self.reporter.history(HistoryEntry(clock.wall(), "recovered", obj=obj))
                    self.memory.state.last_errors.pop(obj, None)
            settled = not any(isinstance(a, Waiting) or a.changes_kernel for a in mine)
            if obj in expectations and settled:
                del expectations[obj]  # what we waited for has appeared (or is moot)

    def _look_again(self, actions: list[Action], batch: Batch) -> None:
        """One more pass, after the delay a NotServing asks for, at what the kernel changes
        without an event (an rxe link's GIDs). Armed by passes something else started,
        never by that look's own pass: a link that stays unable to serve costs one pass
        per event, and rdmad stays idle. READY=1 does not wait for it: a new link's GIDs
        are there when the kernel answers the add (measured: 20 of 20 adds); what races is
        an address added later, whose GID the kernel makes from a work queue."""
        waiting = [a for a in actions if isinstance(a, NotServing) and a.recheck > 0]
        # Their netdevs' address changes start a pass (the GIDs follow the addresses).
        self.shared.queue.address_watch = frozenset(
            a.netdev_ifindex for a in waiting if a.netdev_ifindex is not None
        )
        if waiting and set(batch.sources) != {"recheck"}:
            self.timers.arm_look_again(min(a.recheck for a in waiting))

    def _tell_pauses(self, observed: Observed) -> bool:
        """Pauses that began or ended since the last observation, into the history
        (saved with the state at the end of the pass); True when there were any."""
        if self._pauses is None:
            self._pauses = PauseHistory(self.memory.state.history)
        entries = self._pauses.seen(observed.pause_record, self.shared.clock.wall())
        if entries:
            self.reporter.history(*entries)
        return bool(entries)

    def _cause(self, batch: Batch) -> str:
        if not self.shared.passes:
            return self.memory.start_kind or "start"
        if batch.driver:
            return "driver-reload"
        return batch.describe()

    def healthy(self) -> tuple[bool, str]:
        """Alive unless one action (or an observation) has run past its budget."""
        o = self.shared.options
        now = self.shared.clock.monotonic()
        in_flight = self.applier.in_flight
        if in_flight is not None:
            action, since = in_flight
            budget = budget_for(action, o)
            if now - since > budget:
                return False, f"{action.describe()} running for {now - since:.0f} s"
        observing = self.observing_since
        if observing is not None and now - observing > o.action_budget:
            return False, f"observe running for {now - observing:.0f} s"
        return True, ""


# Actions whose kernel work can take minutes on large NICs (a numvfs write, modprobe, a
# VF driver bind, an eSwitch mode change re-creating every vport): the long budget.
LONG_ACTIONS = (SetNumVfs, LoadModule, BindVfDriver, SetEswitch)


def budget_for(action: Action, options: AgentOptions) -> float:
    """How long ``action`` may run before the loop counts as stuck (no WATCHDOG=1)."""
    return options.long_action_budget if isinstance(action, LONG_ACTIONS) else options.action_budget
