"""Time for the agent: monotonic for deadlines, wall for history, timers on either.

Everything in the agent that waits goes through ``Clock.call_at``, so tests swap
in a fake clock (tests/support/fakeclock.py) and move time by hand: no test
sleeps to wait for the daemon.
"""

from __future__ import annotations

import asyncio
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


async def sleep_until(clock: Clock, when: float) -> None:
    """Wait until ``clock.monotonic() >= when`` (on the fake clock too)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    handle = clock.call_at(when, wake)
    try:
        await done
    finally:
        handle.cancel()
