"""The node_exporter textfile: ``rdmad.prom`` in a directory node_exporter reads.

``TextfileWriter`` rewrites the file every ``interval`` seconds and soon after the
status changes, at most once per ``debounce`` seconds however busy the loop is.
The metrics are rendered on the loop (fast, and the only thread that may read the
trigger queue's counters); the file is written in a worker thread, because a disk
can hang and the reconcile loop must not hang with it. Each write is atomic (a
temp file in the same directory, fsync, rename, fsync of the directory), so
node_exporter never reads half a file. Failures are logged once per kind (then
again after a success) and never raised: metrics are not worth stopping for.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from pathlib import Path

import structlog

from rdmad.api.metrics import Metrics
from rdmad.fileio import write_atomic
from rdmad.status import Change

log = structlog.get_logger("rdmad.metrics")

FILENAME = "rdmad.prom"
DEBOUNCE = 1.0  # seconds between writes at most once, however often the status changes
# node_exporter usually runs as another user: the file must be readable by it.
FILE_MODE = 0o644


class TextfileWriter:
    def __init__(
        self,
        metrics: Metrics,
        directory: str | os.PathLike[str],
        interval: float = 15.0,
        *,
        debounce: float = DEBOUNCE,
        filename: str = FILENAME,
    ) -> None:
        self.metrics = metrics
        self.path = Path(directory) / filename
        self.interval = interval
        self.debounce = debounce
        self.writes = 0  # files written so far
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing: set[str] = set()  # kinds of failure logged since the last success

    def start(self) -> None:
        """Write now, then keep writing; on the running loop."""
        self.metrics.status.subscribe(self._on_change)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rdmad-textfile")

    async def close(self) -> None:
        """Stop, then write once more (after ``Metrics.close`` it says rdmad is down)."""
        self.metrics.status.unsubscribe(self._on_change)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            await self.write_now()

    def _on_change(self, change: Change) -> None:
        # Runs on the loop inside the store's publish: only flag it.
        self._changed.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            written = loop.time()
            await self.write_now()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.interval)
            rest = written + self.debounce - loop.time()
            if rest > 0:
                await asyncio.sleep(rest)  # debounce: a burst of changes is one write
            self._changed.clear()  # before rendering: a change from now on is seen again

    async def write_now(self) -> bool:
        """Render and write the file once; False (and logged) if that failed."""
        try:
            data = self.metrics.render()
            await asyncio.to_thread(write_atomic, self.path, data)
        except Exception as exc:
            self._failed(exc)
            return False
        self.writes += 1
        if self._failing:
            self._failing.clear()
            log.info("metrics.textfile-recovered", path=str(self.path))
        return True

    def _failed(self, exc: Exception) -> None:
        code = getattr(exc, "errno", None)
        kind = type(exc).__name__ + (f"/{errno.errorcode.get(code, code)}" if code else "")
        if kind in self._failing:
            return
        self._failing.add(kind)
        log.warning(
            "metrics.textfile-failed",
            path=str(self.path),
            error=str(exc),
            kind=kind,
            note="logged once until it works again",
        )


__all__ = ["FILENAME", "TextfileWriter", "write_atomic"]
