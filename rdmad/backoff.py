"""Per-object retry with exponential backoff and a cap.

An object whose action fails (EBUSY, a timeout, a driver refusing) is retried
after base, 2·base, 4·base ... up to ``cap`` seconds, never in a tight loop;
other objects are not held back. Success (the object converged) forgets it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec

DEFAULT_BASE = 1.0
DEFAULT_CAP = 300.0


class Failure(msgspec.Struct, frozen=True):
    obj: str
    error: str  # the last error, in words
    failures: int  # consecutive failures
    since: float  # monotonic time of the first failure in this run
    retry_at: float  # monotonic time before which the object is left alone
    wall: float  # wall time of the last failure (for status/history)
    errno: int | None = None  # the kernel's errno of the last error, when it gave one


class Backoff:
    def __init__(
        self,
        base: float = DEFAULT_BASE,
        cap: float = DEFAULT_CAP,
        jitter: float = 0.1,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.base = base
        self.cap = cap
        self.jitter = jitter  # ± fraction, so many nodes do not retry in lockstep
        self._rng = rng
        self._failures: dict[str, Failure] = {}

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failures (1 -> base)."""
        raw: float = min(self.cap, self.base * 2.0 ** min(failures - 1, 62))
        spread = raw * self.jitter * (2 * self._rng() - 1)
        return min(self.cap, max(0.0, raw + spread))

    def fail(
        self, obj: str, error: str, now: float, wall: float, errno: int | None = None
    ) -> Failure:
        prev = self._failures.get(obj)
        count = prev.failures + 1 if prev else 1
        since = prev.since if prev else now
        f = Failure(obj, error, count, since, now + self.delay(count), wall, errno)
        self._failures[obj] = f
        return f

    def succeed(self, obj: str) -> bool:
        """Forget an object's failures; True if it had any."""
        return self._failures.pop(obj, None) is not None

    def blocked(self, obj: str, now: float) -> Failure | None:
        """The failure that keeps ``obj`` from being retried now, if any."""
        f = self._failures.get(obj)
        return f if f is not None and now < f.retry_at else None

    def get(self, obj: str) -> Failure | None:
        return self._failures.get(obj)

    def next_retry(self) -> float | None:
        return min((f.retry_at for f in self._failures.values()), default=None)

    def forget_except(self, objs: set[str]) -> None:
        """Drop objects no longer declared (after a reload)."""
        for obj in list(self._failures):
            if obj not in objs:
                del self._failures[obj]

    def failures(self) -> dict[str, Failure]:
        return dict(self._failures)
