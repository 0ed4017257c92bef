"""What became of an action: one ``WriteRecord`` per kernel write, and the verdict.

Shared by the real host and the dry-run recorder, so history, logs and a dry run
describe a write the same way.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence

import msgspec

from rdmad.kernel.errors import KernelError
from rdmad.model import Action, format_value


class WriteRecord(msgspec.Struct, frozen=True):
    """One kernel change rdmad made (or tried to), for logs and the agent's history."""

    at: float  # time.time() when the write finished
    kind: str  # the action kind, e.g. "set-numvfs"
    obj: str  # the declared object, e.g. "sriov pci=0000:3b:00.0"
    target: str  # what was written, e.g. "0000:3b:00.0 sriov_numvfs"
    old: object
    new: object
    reason: str
    error: KernelError | None = None
    seconds: float = 0.0
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        what = f"{self.target}: {format_value(self.old)} -> {format_value(self.new)}"
        if self.dry_run:
            return f"would set {what} ({self.reason})"
        tail = "ok" if self.error is None else f"FAILED: {self.error}"
        return f"{what} ({self.reason}): {tail}"


# The last writes a host keeps in ``records`` (tests and the lab read them; the
# agent's history is what users see). Bounded: a daemon lives for months, and an
# unbounded list grew ~10 records per PF driver reload (found by the soak's probe).
RECORDS_KEPT = 256


def recent_records() -> deque[WriteRecord]:
    return deque(maxlen=RECORDS_KEPT)


class Outcome(enum.Enum):
    APPLIED = "applied"  # every change made
    PARTIAL = "partial"  # some changes made, some refused (SetVfSettings, SetIbVf)
    FAILED = "failed"  # nothing made
    NOT_APPLIED = "not-applied"  # Blocked / Waiting: nothing to do by design
    RECORDED = "recorded"  # dry run: what would be done
    STALE = "stale"  # the kernel changed since the plan (re-checked before a destructive write)


class ApplyResult(msgspec.Struct, frozen=True):
    """What became of one action: its writes (old -> new, error each) and the verdict."""

    action: Action
    outcome: Outcome
    writes: tuple[WriteRecord, ...] = ()
    note: str = ""

    @property
    def ok(self) -> bool:
        """Nothing failed (a dry run, a stale action and Blocked/Waiting count as ok)."""
        return self.outcome not in (Outcome.FAILED, Outcome.PARTIAL)

    @property
    def stale(self) -> bool:
        """Dropped unapplied: the kernel no longer matches the plan; re-plan."""
        return self.outcome is Outcome.STALE

    @property
    def errors(self) -> tuple[KernelError, ...]:
        return tuple(w.error for w in self.writes if w.error is not None)

    def describe(self) -> str:
        head = f"{self.action.describe()}: {self.outcome.value}"
        if self.note:
            head += f" ({self.note})"
        lines = [head, *(f"  {w.describe()}" for w in self.writes if not w.ok)]
        return "\n".join(lines)


def verdict(action: Action, writes: Sequence[WriteRecord], note: str = "") -> ApplyResult:
    failed = sum(1 for w in writes if w.error is not None)
    if failed == 0:
        outcome = Outcome.APPLIED
    elif failed == len(writes):
        outcome = Outcome.FAILED
    else:
        outcome = Outcome.PARTIAL
    return ApplyResult(action, outcome, tuple(writes), note)


def not_applied(action: Action) -> ApplyResult:
    return ApplyResult(action, Outcome.NOT_APPLIED, note=f"not applied: {action.describe()}")
