"""The agent's loop: it only schedules. Triggers in, one pass at a time, coalesced.

    triggers ─→ TriggerQueue ─→ (leading edge + settle) ─→ PassRunner.run(batch)

* Leading edge: the first trigger on an idle loop starts a pass at once. Triggers
  arriving during a pass or within ``settle`` after it are merged into ONE
  follow-up pass at the end of that window; a burst (many triggers) waits for
  ``settle`` of quiet instead, bounded by ``settle_max`` so an endless stream
  cannot starve the loop.
* One writer: only the pass runner applies. Everything else (signals, event
  sources, timers, the API) only puts a ``Trigger`` on the queue. What a pass at
  rest planned ahead for an awaited event (``reconcile.reactions``) is applied by the
  runner too, first thing in the pass that event starts (``fastpath``).

The parts: ``runner`` (the pass, and the order of one told in full), ``fastpath``
(reactions, reflexes, narrow observations), ``applying`` (one plan, with backoff and
staleness), ``reporting`` (status, history, READY/STATUS), ``memory`` (config and
state file), ``timers`` (drift, retry, expectations, start-up, watchdog),
``protocols`` (what the agent needs from outside, declared once).
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import AsyncIterable, Callable, Sequence

import structlog

from rdmad.agent.memory import Memory
from rdmad.agent.options import AgentOptions, PassInfo, Shared
from rdmad.agent.protocols import ConfigLoader, Host, Notifier, NullNotifier, Planner
from rdmad.agent.reporting import Reporter
from rdmad.agent.runner import PassRunner
from rdmad.agent.timers import Timers
from rdmad.backoff import Backoff
from rdmad.clock import Clock, SystemClock
from rdmad.reconcile import plan
from rdmad.state import State, StateStore
from rdmad.status import HistoryEntry, StatusStore
from rdmad.triggers import Trigger, TriggerQueue

log = structlog.get_logger("rdmad.agent")

SOON = 0.01  # s after a pass, for a "soon" or narrow batch (instead of the settle window);
# a narrow batch of link news alone: at once
MAX_SOON_STREAK = 3  # soon passes in a row; then the settle window again
# Triggers taken since the loop was last idle, in bursts (``burst`` each), that make any
# further batch a burst however small: a stream of link news taken by a fast loop in
# batches below ``burst`` (at nice -5, 86 passes for 1,000 netdev events) is coalesced
# as one taken by a slow loop is, not at the pace the loop happens to run at.
STREAM_BURSTS = 4


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
        clock = clock or SystemClock()
        o = options or AgentOptions()
        self.shared = Shared(
            clock=clock,
            queue=queue or TriggerQueue(clock),
            options=o,
            backoff=Backoff(o.backoff_base, o.backoff_cap, o.backoff_jitter, rng),
            rng=rng,
        )
        self.status = status or StatusStore()
        self.reporter = Reporter(self.shared, self.status, notifier or NullNotifier())
        self.memory = Memory(
            self.shared,
            load_config=load_config,
            state_store=state_store,
            boot_id=boot_id,
            record=self.reporter.history,
        )
        self.reporter.memory = self.memory
        self.timers = Timers(self.shared)
        self.runner = PassRunner(
            self.shared,
            host=host,
            planner=planner,
            memory=self.memory,
            reporter=self.reporter,
            timers=self.timers,
        )
        self.sources = list(sources)
        self._stopping = False
        self._sleeper: asyncio.Future[None] | None = None
        self._soon_streak = 0  # passes in a row started "soon" (see _settle)
        self._streamed = 0  # triggers taken since the loop was last idle (see _settle)
        self._tasks: list[asyncio.Task[None]] = []

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
        self.runner.applier.stopping = True
        self.queue.wake()
        if self._sleeper is not None and not self._sleeper.done():
            self._sleeper.set_result(None)

    # --- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        self._start()
        try:
            while not self._stopping:
                if not await self.queue.wait():
                    continue
                batch = self.queue.take()
                if batch is None or self._stopping:
                    continue
                self._streamed += batch.count
                pass_end = await self.runner.run(batch)
                await self._settle(pass_end)
        finally:
            self._shutdown()

    def _start(self) -> None:
        clock, memory, reporter, timers = self.clock, self.memory, self.reporter, self.timers
        reporter.started_at = clock.monotonic()
        self.status.restore(memory.load_state())
        self.runner.reload_config(initial=True)
        memory.state.started_at = clock.wall()
        dry = " dry run" if self.options.dry_run else ""
        reporter.history(
            HistoryEntry(
                clock.wall(),
                "start",
                what=f"rdmad started ({memory.start_kind}){dry}",
                cause=memory.start_kind,
            )
        )
        timers.arm_startup(self._startup_deadline)
        timers.arm_drift()
        timers.arm_watchdog(
            self.runner.healthy, lambda: reporter.notify("WATCHDOG=1"), lambda: self._stopping
        )
        loop = asyncio.get_running_loop()
        for source in self.sources:
            self._tasks.append(loop.create_task(self._pump(source)))
        reporter.publish([], None, [], timers.expectations)
        self.queue.put(Trigger("startup", memory.start_kind))

    def _startup_deadline(self) -> None:
        if not self.reporter.ready:
            self.runner.set_ready(f"startup deadline of {self.options.startup_timeout:g} s reached")

    def _shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.timers.cancel_all()
        self.memory.save_state()
        self.reporter.notify("STOPPING=1")
        log.info("agent.stopped", passes=len(self.passes))

    async def _settle(self, pass_end: float) -> None:
        """Return when the follow-up pass should start, or when the loop is idle again.

        The window is ``settle`` after the pass: what arrives during the pass or in
        it is answered by one follow-up at its end, so a lone event waits at most
        ``settle``. A burst (``burst`` triggers or more pending) instead waits for
        ``settle`` of quiet, bounded by ``settle_max``: a driver reload's hundreds of
        uevents cost a handful of passes, not one per window.
        """
        while not self._stopping:
            o = self.options
            pending = self.queue.pending
            if pending is None:
                if not await self.queue.wait(pass_end + o.settle):
                    self._soon_streak = self._streamed = 0
                    return  # idle: the next trigger is a leading edge again
                continue
            if pending.urgent:
                return
            due = pass_end + o.settle
            soon = (pending.soon or pending.narrow) and self._soon_streak < MAX_SOON_STREAK
            if pending.count >= o.burst or self._streamed >= STREAM_BURSTS * o.burst:
                due = min(max(due, pending.last_at + o.settle), pending.first_at + o.settle_max)
            elif soon:
                # Cheap to answer (narrow) or an action dropped as stale: look again
                # shortly, a few times in a row at most, so a stream stays coalesced.
                # Link news need no read at all: at once (a veth pair's second netdev is
                # announced while the pass for the first one runs).
                due = min(due, pass_end + (0.0 if pending.news_only else SOON))
            if due <= self.clock.monotonic():
                self._soon_streak = self._soon_streak + 1 if soon else 0
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
        self.reporter.notes[name] = f"event source {name} {why}; relying on the drift timer"
        self.queue.put(Trigger("resync", f"{name} {why}", stale=True))

    # --- read-only views for the daemon, tests and benchmarks ------------------------------

    @property
    def clock(self) -> Clock:
        return self.shared.clock

    @property
    def queue(self) -> TriggerQueue:
        return self.shared.queue

    @property
    def options(self) -> AgentOptions:
        return self.shared.options

    @property
    def backoff(self) -> Backoff:
        return self.shared.backoff

    @property
    def passes(self) -> deque[PassInfo]:
        return self.shared.passes

    @property
    def ready(self) -> bool:
        return self.reporter.ready

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def state(self) -> State:
        return self.memory.state

    @property
    def state_store(self) -> StateStore | None:
        return self.memory.state_store

    @property
    def start_kind(self) -> str:
        return self.memory.start_kind

    @property
    def started_at(self) -> float:
        return self.reporter.started_at

    @property
    def planner(self) -> Planner:
        return self.runner.planner

    @planner.setter
    def planner(self, planner: Planner) -> None:  # tests swap in a planner with a bug
        self.runner.planner = planner
