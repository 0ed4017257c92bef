"""A clock that moves only when told, for driving the agent without sleeping."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from rdmad.clock import Cancellable


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
