"""One reconcile pass: (reaction ->) observe -> plan -> apply -> bookkeeping -> status.

A pass that ends at rest arms the reactions its plan implies (``reconcile.reactions``):
the next pass, if its events are the ones awaited, applies them before it observes,
and is their check.

A failure anywhere in it (observe raises, plan() has a bug) is reported, retried
with backoff, and never ends the loop. RELOADING=1 is always answered by READY=1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import structlog

from rdmad.agent.applying import Applied, Applier, made_stale
from rdmad.agent.memory import Memory
from rdmad.agent.options import PassInfo, Shared
from rdmad.agent.pauses import PauseHistory
from rdmad.agent.protocols import Host, NarrowObserver, Planner, Reflexive
from rdmad.agent.reporting import Reporter
from rdmad.agent.timers import Timers
from rdmad.model import (
    Action,
    AddRxe,
    BindVfDriver,
    LoadModule,
    NotServing,
    Observed,
    SetNumVfs,
    Waiting,
)
from rdmad.reconcile import declared_objects
from rdmad.reconcile.reactions import NONE, Reactions, anticipate
from rdmad.status import HistoryEntry
from rdmad.triggers import Batch, Trigger

log = structlog.get_logger("rdmad.agent")

# A narrow pass takes in link news that came while it observed, this many times at most,
# giving the event sources SOURCE_TURNS loop turns each time to read their sockets.
MAX_NEWS_FOLDS = 3
SOURCE_TURNS = 3
# Added to the cause of what a reaction applied (history, status): why it was so quick.
PLANNED_AHEAD = " (planned ahead)"
# ...and sent by the event reader itself (kernel.events.reflex), before the pass began.
SENT_ON_EVENT = " (planned ahead, sent as the event was read)"


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
        self._followups = 0
        self.narrow_passes = 0  # passes that read only what link events changed
        self.reactions_applied = 0  # passes that began with a reaction
        self._reactions: Reactions = NONE  # armed by the last pass that ended at rest
        self._reactions_on: Observed | None = None  # what they were planned on
        # Checked once: a runtime protocol check costs about what a narrow pass's plan does.
        self._narrow_host = host if isinstance(host, NarrowObserver) else None
        self._reflexive = host if isinstance(host, Reflexive) else None
        self._reflex_sent: set[str] = set()  # rxe links a reflex sent since it was armed
        self._pauses: PauseHistory | None = None  # made from the history the state kept

    async def run(self, batch: Batch) -> float:
        """One pass; returns when it ended (monotonic)."""
        if batch.reload:
            usec = int(self.shared.clock.monotonic() * 1e6)
            self.reporter.notify(f"RELOADING=1\nMONOTONIC_USEC={usec}")
        if self._reflexive is not None and self._reflex_sent:
            # An add the event reader sent may be sent again while the kernel releases
            # the old device's name: its timers need the loop more than this pass does,
            # which would only wait for it in apply().
            await self._reflexive.reflexes_answered()
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
        if batch.reload:
            self.reload_config(initial=False)
        if batch.driver:
            self.memory.forget_peermem_hold()  # a module came or went: worth one more try
        reacted = await self._react(batch)
        if reacted is not None:
            cause = self._cause(batch)  # it may have taken in news that came meanwhile
        self.observing_since = started
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

        try:
            actions = self.planner(memory.desired, observed, memory.plan_state())
        except Exception as exc:  # a bug in plan(): report it, keep the loop alive
            log.exception("plan.crashed")
            return self._failed("plan", batch, cause, started, exc)
        self._succeeded("plan")
        planned_at = clock.monotonic()
        objects = self.objects(actions)
        reporter.publish_plan(objects, actions, cause, batch.through)
        if batch.plan_only:
            return clock.monotonic()  # asked for the plan only (the API): apply nothing
        reporter.log_notes(objects, actions)

        done = await self.applier.apply_all(actions, cause, observed, frozenset(batch.touched))
        if reacted is not None:
            done = Applied(
                done.count + reacted.count,
                done.changed or reacted.changed,
                done.aborted or reacted.aborted,
            )
        now = clock.monotonic()
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
        self._follow_up(done.changed, actions)
        timers.arm_retry()
        timers.arm_expectations()

        resting = not done.changed and not done.aborted and not timers.expecting(now)
        reporter.answered = batch.through
        reporter.publish(objects, observed, actions, timers.expectations)
        if done.changed or done.count or first or batch.reload or told:
            memory.save_state()
        if not reporter.ready and resting:
            self.set_ready("first reconcile done")
        reporter.notify_status()
        if resting and not shared.options.dry_run:
            # Off the event path: the pass has answered. Planned on this observation,
            # which is the node now, as far as events tell (the next batch says the rest).
            self._arm(observed, actions)
        return clock.monotonic()

    def _arm(self, observed: Observed, actions: list[Action]) -> None:
        try:
            reactions = anticipate(
                self.memory.desired, observed, self.memory.plan_state(), self.planner, actions
            )
        except Exception:  # a bug in plan(): its own pass reports those; nothing armed
            log.exception("reactions.crashed")
            return
        self._set_reactions(reactions, observed)

    def _set_reactions(self, reactions: Reactions, on: Observed | None) -> None:
        self._reactions, self._reactions_on = reactions, on
        # A new netdev other than these waits a little for them (TriggerQueue.put).
        self.shared.queue.awaited_netdevs = frozenset(reactions.on_netdev)
        host = self._reflexive
        if host is None:
            return
        if reactions and not self.shared.options.dry_run:
            # The event readers send these adds themselves, before this loop hears of
            # the event; the pass it starts collects the outcome (Reflexive).
            self._reflex_sent.clear()
            host.arm_reflexes(
                _adds(reactions.on_netdev), _adds(reactions.on_rdma_removed), self._reflex_gate
            )
        else:
            host.disarm_reflexes()

    def _reflex_gate(self, action: AddRxe) -> bool:
        """Right before a reflex sends ``action``: only if the reaction would still be
        applied (nothing pending that disarms it or makes it stale), with its claim
        written first (Applier._claim_before_create)."""
        if self.applier.stopping:
            return False
        pending = self.shared.queue.pending
        if pending is not None and (
            pending.rdma_other or not pending.may_react or made_stale(pending, action)
        ):
            return False
        self.memory.claim_rxe(action.name)
        self._reflex_sent.add(action.name)
        return True

    async def _react(self, batch: Batch) -> Applied | None:
        """Apply what the last pass planned ahead for this batch's events; None: nothing.

        The reactions hold only for the node the last pass saw, changed by nothing but
        this batch's events: a batch with anything else in it (a lost event, a reload, a
        driver, an RDMA device that came) disarms them, and an action whose names the
        batch renamed or removed is left to the pass. The pass that follows observes
        the RDMA links again and is the reaction's check.

        An add an event reader already sent (Reflexive) is applied here whatever the
        batch holds: the kernel has it (or refused it), and only apply() records it;
        its own device's `add` uevent, read before this pass began, is in the batch.
        """
        if batch.plan_only:
            return None  # the API's plan: it applies nothing, and leaves them armed
        reactions, on = self._reactions, self._reactions_on
        self._set_reactions(NONE, None)
        if not reactions or on is None:
            return None
        sent = [a for a in _adds_of(reactions) if a.name in self._reflex_sent]
        due: list[Action] = []
        if not batch.rdma_other and batch.may_react:
            due = self._due(reactions, batch)
            if not due and not sent and reactions.on_netdev and batch.news_only:
                # A veth pair's peer is announced first: the netdev awaited may be next.
                more = await self._more_news()
                if more is not None:
                    batch.absorb(more)
                    if not batch.rdma_other and batch.may_react:
                        due = self._due(reactions, batch)
        due += [a for a in sent if a not in due]
        if not due:
            return None
        self.reactions_applied += 1
        log.debug("reconcile.reaction", actions=[a.describe() for a in due])
        cause = f"{self._cause(batch)}{SENT_ON_EVENT if sent else PLANNED_AHEAD}"
        done = await self.applier.apply_all(due, cause, on, frozenset(batch.touched))
        batch.rdma = True  # the pass reads the RDMA links the reaction changed
        return done

    @staticmethod
    def _due(reactions: Reactions, batch: Batch) -> list[Action]:
        """The reactions this batch's events make due, less those it made stale (an
        RDMA device's own removal is what its reaction waits for: not stale for it)."""
        out = []
        for action in reactions.due(sorted(batch.added), sorted(batch.removed_rdma)):
            if not made_stale(batch, action) and action not in out:
                out.append(action)
        return out

    async def _more_news(self) -> Batch | None:
        """Link news the event sources put within SOURCE_TURNS loop turns, taken."""
        queue = self.shared.queue
        for _turn in range(SOURCE_TURNS):
            await asyncio.sleep(0)  # a reader callback, then the source's task
        more = queue.pending
        if more is None or not more.news_only:
            return None  # nothing, or something to read (e.g. RDMA devices): a pass
        return queue.take()

    async def _observe(self, batch: Batch, first: bool) -> tuple[Observed, bool]:
        """Everything, or after link events only what they can have changed (then True).

        The narrow read is the event path's: an rxe link whose netdev just appeared
        is added from the link event's own news (at most one netlink dump), not a walk of
        sysfs and /proc. Any pass that changed the kernel is followed by a full one,
        which verifies it.
        """
        host = self.host
        narrow = batch.narrow and not (first or batch.reload or batch.driver or batch.stale_all)
        if narrow and self._narrow_host is not None:
            observed = await self._narrow_host.observe_changed(batch.rdma, batch.link_news())
            if observed is not None:
                observed = await self._fold_news(batch, observed)
            if observed is not None:
                self.narrow_passes += 1
                return observed, True
        if not batch.plan_only:
            self.timers.arm_drift()  # a full observation: drift counts from here
        return await host.observe(), False

    async def _fold_news(self, batch: Batch, observed: Observed) -> Observed | None:
        """Link news that came while a narrow observation ran, taken into it.

        A veth pair, or a netdev and its VLAN, are announced one after the other; a
        pass started by the first would plan without the second, and its news could be
        read only when the pass ends (the loop is busy until then). So the event sources
        get a few loop turns, and news they put meanwhile is read into this pass (the
        batch absorbs it: this pass answers those triggers). None: observe() instead.
        """
        assert self._narrow_host is not None
        if batch.plan_only or not batch.links:
            return observed  # not started by link news: nothing is announced in pairs
        for _ in range(MAX_NEWS_FOLDS):
            taken = await self._more_news()
            if taken is None:
                return observed
            batch.absorb(taken)
            folded = await self._narrow_host.observe_changed(taken.rdma, taken.link_news())
            if folded is None:
                return None
            observed = folded
        return observed

    def reload_config(self, initial: bool) -> None:
        if self.memory.reload_config(initial):
            self.shared.backoff.forget_except(self.memory.objects() | {"observe", "plan"})
            self.applier.last_applied.clear()

    def set_ready(self, why: str) -> None:
        self.timers.cancel("startup")
        self.reporter.set_ready(why)

    def objects(self, actions: list[Action]) -> list[str]:
        objs = declared_objects(self.memory.desired)
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
            slow = isinstance(action, SetNumVfs | LoadModule | BindVfDriver)
            budget = o.long_action_budget if slow else o.action_budget
            if now - since > budget:
                return False, f"{action.describe()} running for {now - since:.0f} s"
        observing = self.observing_since
        if observing is not None and now - observing > o.action_budget:
            return False, f"observe running for {now - observing:.0f} s"
        return True, ""


def _adds_of(reactions: Reactions) -> list[AddRxe]:
    """Every rxe add the reactions hold, once."""
    out: list[AddRxe] = []
    for by_event in (reactions.on_netdev, reactions.on_rdma_removed):
        for adds in _adds(by_event).values():
            out += [a for a in adds if a not in out]
    return out


def _adds(by_event: Mapping[str, tuple[Action, ...]]) -> dict[str, list[AddRxe]]:
    """The rxe adds of reactions, by the name whose event makes them due."""
    out: dict[str, list[AddRxe]] = {}
    for name, actions in by_event.items():
        adds = [a for a in actions if isinstance(a, AddRxe)]
        if adds:
            out[name] = adds
    return out
