"""Waiting, bounded, for the agent to answer a trigger: no polling.

One store listener serves every waiting request: on each change it sets the
events whose condition now holds (a few comparisons, on the loop, as the store
asks of listeners). ``close()`` releases every waiter, so a daemon that stops
answers its pending requests with 503 at once instead of at their deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rdmad.api import timeouts
from rdmad.status import Change, StatusView

Condition = Callable[[], bool]


class Closed(Exception):
    """The API is closing; nothing will answer."""


class Waiters:
    def __init__(self, store: StatusView) -> None:
        self._store = store
        self._waiting: dict[asyncio.Event, Condition] = {}
        self._closed = False
        store.subscribe(self._changed)

    def _changed(self, _change: Change) -> None:
        for event, condition in list(self._waiting.items()):
            if condition():
                event.set()

    @property
    def pending(self) -> int:
        """Requests waiting now."""
        return len(self._waiting)

    async def until(self, condition: Condition, timeout: float) -> bool:
        """True once ``condition()`` holds; False after ``timeout`` seconds; Closed if
        the API closes first."""
        if self._closed:
            raise Closed
        if condition():
            return True
        event = asyncio.Event()
        self._waiting[event] = condition
        try:
            async with timeouts.timeout(timeout):
                await event.wait()
        except asyncio.TimeoutError:
            return condition()
        finally:
            del self._waiting[event]
        if self._closed and not condition():
            raise Closed
        return True

    def close(self) -> None:
        self._closed = True
        self._store.unsubscribe(self._changed)
        for event in self._waiting:
            event.set()
