"""Time for the agent: monotonic for deadlines, wall for history, timers on either.

Everything in the agent that waits goes through ``Clock.call_at``, so tests swap
in ``FakeClock`` and move time by hand: no test sleeps to wait for the daemon.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        """Run ``callback`` on the event loop once ``monotonic() >= when``."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic`` (what asyncio's loop uses) and ``time.time``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - time.monotonic()), callback)


class _FakeTimer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock that moves only when told; timers fire inside ``advance``."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self.now = start
        self.wall_offset = wall_offset
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self.wall_offset

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        timer = _FakeTimer(when, callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def pending(self) -> list[float]:
        """Deadlines of live timers, soonest first."""
        return sorted(w for w, _, t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time forward, firing due timers in deadline order."""
        target = self.now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not timer.cancelled:
                timer.callback()
        self.now = target
