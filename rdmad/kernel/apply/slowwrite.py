"""Sysfs writes that can block: off the event loop, with a deadline, never twice at once.

A numvfs write takes a minute on large NICs (ConnectX-6 Lx, 125 VFs: ~65 s); unbind,
drivers_probe and GUID writes run driver code that can block too. A thread cannot
be stopped once the kernel has the write: past the deadline the error says so, the
write stays registered under its path, and no second write to that file starts
until the first has returned (two numvfs writes racing in a driver help nobody).
"""

from __future__ import annotations

import asyncio
import errno
import logging

from rdmad.clock import Clock
from rdmad.kernel.errors import KernelError
from rdmad.kernel.sysfs import Sysfs

log = logging.getLogger("rdmad.kernel")

NUMVFS_DEADLINE = 300.0  # ConnectX-6 Lx: 125 VFs take ~65 s; leave room
SYSFS_DEADLINE = 30.0  # unbind, drivers_probe, driver_override, GUIDs: a driver can block
PROGRESS_EVERY = 5.0  # log a long write's progress this often


class SlowWrites:
    def __init__(self, clock: Clock, numvfs_deadline: float) -> None:
        self.clock = clock
        self.numvfs_deadline = numvfs_deadline
        self.running: dict[str, tuple[asyncio.Future[None], float]] = {}  # path -> (task, since)

    async def write(self, sysfs: Sysfs, rel: str, value: str, op: str, who: str) -> None:
        """Write ``value`` to ``rel`` of ``sysfs``; ``who`` names the object in progress lines."""
        running = self.running.get(rel)
        if running is not None and not running[0].done():
            since = self.clock.monotonic() - running[1]
            raise KernelError(
                op,
                rel,
                errno.EBUSY,
                f"an earlier write to this file has been running for {since:.0f} s; "
                "not writing again until it returns",
            )
        deadline = self.numvfs_deadline if rel.endswith("sriov_numvfs") else SYSFS_DEADLINE
        task = asyncio.ensure_future(asyncio.to_thread(sysfs.write, rel, value, op=op))
        started = self.clock.monotonic()
        self.running[rel] = (task, started)
        task.add_done_callback(lambda t: self._ended(rel, t))
        while True:
            left = deadline - (self.clock.monotonic() - started)
            if left <= 0:
                raise KernelError(
                    op,
                    rel,
                    errno.ETIMEDOUT,
                    f"still running after {deadline:g} s; the kernel may finish "
                    "it later, the next observation will tell",
                )
            done, _ = await asyncio.wait({task}, timeout=min(PROGRESS_EVERY, left))
            if done:
                task.result()  # raises the KernelError of the write
                return
            elapsed = self.clock.monotonic() - started
            log.info("%s: %s still in progress after %.0f s", who, op, elapsed)

    def _ended(self, rel: str, task: asyncio.Future[None]) -> None:
        if self.running.get(rel, (None, 0.0))[0] is task:
            del self.running[rel]
        if not task.cancelled():
            task.exception()  # retrieved: a late failure shows in the next observation
