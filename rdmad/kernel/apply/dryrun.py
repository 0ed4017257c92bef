"""RecordingHost: a dry run. Observes like the real host; apply() only records.

What it records comes from ``kernel.apply.writes.planned_writes``, the same description
the real host executes, so ``rdmad run --dry-run`` shows exactly the writes a real
run would make (targets, old -> new values, order).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from rdmad.kernel.apply.results import (
    ApplyResult,
    Outcome,
    WriteRecord,
    not_applied,
    recent_records,
)
from rdmad.kernel.apply.writes import planned_writes
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import Action, Observed

log = logging.getLogger("rdmad.kernel")


class RecordingHost:
    """``observer`` is any async callable returning an Observed (a KernelHost's observe,
    or a fake); the agent's code path is otherwise the same as a real run."""

    def __init__(self, observer: Callable[[], Awaitable[Observed]], sysfs: Sysfs | None = None):
        self._observer = observer
        self.sysfs = sysfs or Sysfs("/")
        self.records = recent_records()  # the last RECORDS_KEPT writes
        self.last: Observed | None = None

    async def observe(self) -> Observed:
        self.last = await self._observer()
        return self.last

    async def apply(self, action: Action) -> ApplyResult:
        if not action.changes_kernel:
            return not_applied(action)
        now = time.time()
        records = [
            WriteRecord(now, action.kind, action.obj, t, old, new, action.reason, dry_run=True)
            for w in planned_writes(action, self.sysfs)
            for t, old, new in w.changes
        ]
        self.records.extend(records)
        for r in records:
            log.info("%s: dry run: %s", action.obj, r.describe())
        return ApplyResult(action, Outcome.RECORDED, tuple(records), "dry run: nothing changed")
