"""The agent's clocks: drift checks, backoff retries, expectations of the kernel, a
look again at what changes without an event, the start-up deadline and the systemd
watchdog. Each only puts a trigger on the queue (or pings systemd); none touches the
kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import structlog

from rdmad.agent.options import Shared
from rdmad.clock import Cancellable
from rdmad.triggers import Trigger

log = structlog.get_logger("rdmad.agent")

Health = Callable[[], tuple[bool, str]]


class Expectation(msgspec.Struct, frozen=True):
    """The kernel was asked to do something asynchronous (VFs to appear) by ``deadline``."""

    what: str
    deadline: float


class Timers:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.expectations: dict[str, Expectation] = {}  # obj -> what the kernel owes us
        self.look_again_at: float | None = None  # monotonic time of the next look again
        self._timers: dict[str, Cancellable] = {}

    def arm(self, name: str, when: float, callback: Callable[[], None]) -> None:
        self.cancel(name)
        self._timers[name] = self.shared.clock.call_at(when, callback)

    def cancel(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def cancel_all(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self.look_again_at = None

    def _trigger(self, source: str, detail: str) -> Callable[[], None]:
        def put() -> None:
            self.shared.queue.put(Trigger(source, detail))

        return put

    # --- what starts passes ------------------------------------------------------------------

    def arm_drift(self) -> None:
        """The next drift check, counted from now (every pass is a full observation)."""
        o = self.shared.options
        spread = o.drift_interval * o.drift_jitter * (2 * self.shared.rng() - 1)
        when = self.shared.clock.monotonic() + o.drift_interval + spread
        self.arm("drift", when, self._trigger("drift", "periodic check"))

    def arm_module_settle(self, when: float) -> None:
        """A pass once module removals have been quiet long enough (a load waits for it)."""
        self.arm("module-settle", when, self._trigger("module-settle", "module removals quiet"))

    def arm_retry(self) -> None:
        when = self.shared.backoff.next_retry()
        if when is None:
            self.cancel("retry")
        else:
            self.arm("retry", when, self._trigger("retry", "backoff expired"))

    def expect(self, obj: str, what: str, within: float) -> None:
        self.expectations[obj] = Expectation(what, self.shared.clock.monotonic() + within)

    def expecting(self, now: float) -> bool:
        return any(e.deadline > now for e in self.expectations.values())

    def arm_expectations(self) -> None:
        now = self.shared.clock.monotonic()
        live = [e.deadline for e in self.expectations.values() if e.deadline > now]
        if live:
            self.arm("expect", min(live), self._trigger("deadline", "waited for the kernel"))

    def arm_look_again(self, within: float) -> None:
        """One pass ``within`` s from now, for what the kernel changes without an event
        (an rxe link's GIDs); the earliest asked for wins. Cleared when it fires."""
        when = self.shared.clock.monotonic() + within
        if self.look_again_at is not None and self.look_again_at <= when:
            return

        def fire() -> None:
            self._timers.pop("look-again", None)
            self.look_again_at = None
            self.shared.queue.put(Trigger("recheck", "looking again at what has no event"))

        self.look_again_at = when
        self.arm("look-again", when, fire)

    def arm_pause_end(self, until_wall: float | None) -> None:
        """A pass when a guarded stop's pause runs out (``None``: no pause in force).

        The pause ends earlier when its modules are loaded again; their udev events
        start that pass. This timer is for a stop that never brings the stack back.
        """
        if until_wall is None:
            self.cancel("pause")
            return
        clock = self.shared.clock
        when = clock.monotonic() + max(0.0, until_wall - clock.wall()) + 0.05
        self.arm("pause", when, self._trigger("pause", "the guarded stop's pause ran out"))

    # --- start-up and watchdog ---------------------------------------------------------------

    def arm_startup(self, on_deadline: Callable[[], None]) -> None:
        when = self.shared.clock.monotonic() + self.shared.options.startup_timeout

        def fire() -> None:
            self._timers.pop("startup", None)
            on_deadline()

        self.arm("startup", when, fire)

    def arm_watchdog(
        self, health: Health, ping: Callable[[], None], stopping: Callable[[], bool]
    ) -> None:
        """WATCHDOG=1 every ``watchdog_interval`` while ``health()`` says the loop is alive."""
        interval = self.shared.options.watchdog_interval
        if not interval:
            return

        def tick() -> None:
            if stopping():
                return
            ok, why = health()
            if ok:
                ping()
            else:
                # No ping: systemd restarts a loop that is stuck. Say why first.
                log.error("watchdog.withheld", why=why)
            self.arm("watchdog", self.shared.clock.monotonic() + interval, tick)

        self.arm("watchdog", self.shared.clock.monotonic() + interval, tick)
