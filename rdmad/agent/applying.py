"""Applying one plan: actions in order, each held back, dropped as stale or failed
for its own reason, with the bookkeeping that decides what the next pass retries.

* Backoff holds back a retry of what failed, not a new situation; what is held
  holds the rest of its object for the pass (numvfs 4 -> 0 held: no 0 -> 2).
* An event that renamed or removed a name an action uses makes it stale: its
  object waits for the next pass, which observes again. Other objects go on.
* VF attributes the driver refuses as unsupported are remembered (see Memory),
  not retried, and not counted as a failure of their object.
* A peermem load that fails for a lasting reason (rdmad.peermem.diagnose: a missing
  file, a signature, a symbol mismatch) is remembered with the facts it failed on and
  not retried until they change (a module event, a rebuilt module) or the config is
  reloaded; other failures back off as usual.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

import msgspec
import structlog

from rdmad import peermem
from rdmad.agent.memory import Memory
from rdmad.agent.options import Shared
from rdmad.agent.protocols import Host, ResultLike, WriteLike
from rdmad.agent.reporting import Reporter
from rdmad.agent.timers import Timers
from rdmad.model import (
    PF_ATTR,
    Action,
    AddRxe,
    DeleteRxe,
    LoadModule,
    Observed,
    SetEswitch,
    SetNumVfs,
    SetVfSettings,
    UnsupportedKey,
    action_touches,
    format_value,
)
from rdmad.reconcile.peermem import OBJ as PEERMEM_OBJ
from rdmad.status import HistoryEntry
from rdmad.triggers import Batch, Trigger

log = structlog.get_logger("rdmad.agent")


# Errnos with which drivers refuse a VF attribute they do not implement (LAB.md: igb
# link-state and query_rss EOPNOTSUPP, 802.1ad EPROTONOSUPPORT, rates EINVAL).
MAX_STALE_REPLANS = 20  # re-plans of one object after stale drops, in a row

_UNSUPPORTED_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.EPROTONOSUPPORT, errno.EINVAL})


class Applied(msgspec.Struct, frozen=True):
    count: int  # actions handed to the host
    changed: bool  # the kernel changed: a follow-up pass verifies it
    aborted: bool  # something was held as stale: the next pass re-observes


def made_stale(batch: Batch, action: Action) -> bool:
    """Whether events in ``batch`` (after the plan was made) make ``action`` wait for a
    new observation; an rxe add is not stale for a report of its own device's removal."""
    recreates = action.name if isinstance(action, AddRxe) else None
    return batch.makes_stale(action_touches(action), recreates=recreates)


MAX_REDONE = 3  # an action re-applied in a row because events said it was undone
# A module load waits until no module went away for this long: an operator unloading the
# RDMA stack by hand (`modprobe -r` one module after the other, no pause) must not find
# rdmad loading back, between two of its commands, what the next one removes.
MODULE_SETTLE = 1.0


class Applier:
    def __init__(
        self, shared: Shared, host: Host, memory: Memory, reporter: Reporter, timers: Timers
    ) -> None:
        self.shared = shared
        self.host = host
        self.memory = memory
        self.reporter = reporter
        self.timers = timers
        self.last_applied: set[tuple[str, str]] = set()  # (obj, describe) fully applied
        # (obj, describe) applied again in a row because an event said it was undone
        self.redone: dict[tuple[str, str], int] = {}
        self.failed_what: dict[str, set[str]] = {}  # obj -> actions that failed, in backoff
        self.in_flight: tuple[Action, float] | None = None  # action, monotonic start
        self.stale_streak: dict[str, int] = {}  # obj -> actions dropped as stale in a row
        self.stopping = False

    async def apply_all(
        self,
        actions: list[Action],
        cause: str,
        observed: Observed,
        touched: frozenset[str] = frozenset(),
    ) -> Applied:
        """Apply in plan order. ``touched``: names the pass's events were about; an action
        on one of them is a new situation, tried again even while its object backs off."""
        shared = self.shared
        held_objs: set[str] = set()  # objects that failed or are held back in this pass
        applied_now: set[tuple[str, str]] = set()
        count = 0
        changed = False
        aborted = False
        for action in actions:
            if not action.changes_kernel:
                continue
            if self.stopping:
                aborted = True
                break
            obj = action.obj
            pending = shared.queue.pending
            if pending is not None and made_stale(pending, action):
                # A netdev this action names was renamed or removed after we observed: it
                # may point at the wrong device. Hold its object; the next pass re-observes
                # (resolving by ifindex). Events about other devices do not stop the rest.
                log.info("reconcile.plan-stale", obj=obj, why=", ".join(pending.details[:3]))
                aborted = True
                held_objs.add(obj)
                continue
            held = shared.backoff.blocked(obj, shared.clock.monotonic()) is not None
            if held and not touched.isdisjoint(action_touches(action)):
                held = False  # e.g. the netdev an rxe add failed on changed since
            if obj in held_objs or (held and action.describe() in self.failed_what.get(obj, ())):
                held_objs.add(obj)
                continue
            if isinstance(action, LoadModule) and self._modules_settling(action):
                held_objs.add(obj)
                continue
            key = (obj, action.describe())
            if key in self.last_applied and not self._undone_since(key, action, touched):
                self.fail(
                    action,
                    f"{action.describe()}: applied without error, but the kernel "
                    "still shows the old state",
                    cause,
                )
                held_objs.add(obj)
                continue
            self._claim_before_create(action)
            result = await self._apply_one(action)
            if isinstance(action, AddRxe) and (result.stale or not result.ok):
                self.memory.unclaim_rxe(action.name)  # not made: not ours
            if result.stale:
                if result.writes:  # stale midway (re-checked before a later write)
                    self.reporter.record_result(action, result, cause)
                self._stale(action, result, cause)
                held_objs.add(obj)
                aborted = True
                continue
            count += 1
            self.stale_streak.pop(obj, None)
            self.reporter.record_result(action, result, cause)
            refused = self._learn_unsupported(action, result, observed)
            if not result.ok and self._hold_peermem(action, result, observed, cause):
                held_objs.add(obj)
                continue
            if not result.ok and refused < _error_count(result):
                held_objs.add(obj)
                error = _result_error(action, result)
                self.fail(action, error, cause, log_it=False, errno=_result_errno(result))
                continue
            if shared.options.dry_run:
                continue
            changed = True
            applied_now.add(key)
            self._after_success(action, cause)
        self.last_applied = applied_now
        self.redone = {k: n for k, n in self.redone.items() if k in applied_now}
        return Applied(count, changed, aborted)

    def _modules_settling(self, action: LoadModule) -> bool:
        """Whether a module went away less than MODULE_SETTLE ago; if so the load waits
        (not a failure) and a pass comes when the removals have been quiet that long."""
        removed_at = self.shared.queue.module_removed_at
        if removed_at is None or self.shared.options.dry_run:
            return False
        quiet_at = removed_at + MODULE_SETTLE
        if self.shared.clock.monotonic() >= quiet_at:
            return False
        log.info("reconcile.module-settling", obj=action.obj, action=action.describe())
        self.timers.arm_module_settle(quiet_at)
        return True

    def _undone_since(self, key: tuple[str, str], action: Action, touched: frozenset[str]) -> bool:
        """The same action again right after it worked: did someone undo it since?

        Without an event about its names the kernel ignored it ("applied without error,
        but the kernel still shows the old state": a failure). With one (an rxe link
        deleted again by hand, a netdev that came back, a module a stack restart removed)
        it is a new situation: apply it again, up to MAX_REDONE times in a row, so a
        kernel that undoes it at once cannot keep the loop busy.
        """
        if self.shared.options.dry_run:
            return True
        if touched.isdisjoint(action_touches(action)):
            return False
        self.redone[key] = self.redone.get(key, 0) + 1
        return self.redone[key] <= MAX_REDONE

    async def _apply_one(self, action: Action) -> ResultLike:
        self.in_flight = (action, self.shared.clock.monotonic())
        try:
            return await self.host.apply(action)
        except Exception as exc:  # a bug in the host: the object degrades, the loop lives
            log.exception("apply.crashed", obj=action.obj, action=action.describe())
            return _Crashed(exc)
        finally:
            self.in_flight = None

    def _stale(self, action: Action, result: ResultLike, cause: str) -> None:
        """Re-checked right before a destructive write, the kernel had changed (a user
        appeared, a value moved). That write and those after it were not made (the ones
        before it, e.g. a module load, are in history); plan again from a new look."""
        log.info(
            "reconcile.action-stale", obj=action.obj, action=action.describe(), why=result.note
        )
        self.reporter.history(
            HistoryEntry(
                self.shared.clock.wall(),
                "stale",
                obj=action.obj,
                what=action.describe(),
                reason=result.note,
                cause=cause,
                kind=action.kind,
            )
        )
        # Bounded: a kernel that keeps answering so is waited for by events and drift.
        self.stale_streak[action.obj] = streak = self.stale_streak.get(action.obj, 0) + 1
        if streak > MAX_STALE_REPLANS:
            return
        # An rxe add waits only for RDMA links to change: a narrow look will do.
        rxe = isinstance(action, AddRxe)
        again = Trigger(
            "followup", f"re-plan {action.obj}: {result.note}", soon=True, narrow=rxe, rdma=rxe
        )
        self.shared.queue.put(again)

    def _learn_unsupported(self, action: Action, result: ResultLike, observed: Observed) -> int:
        """Remember VF attributes (and eSwitch options) the driver refused as unsupported;
        returns how many.

        They are reported as "unsupported by DRIVER" and not planned again until the
        config or the PF's driver changes, so they neither retry forever nor hold
        READY=1 back. Writes are in the order of ``action.changes`` (one describer).
        """
        # (vf, attribute, value) of each change, in the order of its writes.
        tried: list[tuple[int, str, str]]
        if isinstance(action, SetVfSettings):
            tried = [(c.vf, c.attr, format_value(c.new)) for c in action.changes]
        elif isinstance(action, SetEswitch):  # about the PF itself
            tried = [(PF_ATTR, f"eswitch.{option}", new) for option, _, new in action.changes]
        else:
            return 0
        if len(result.writes) != len(tried):
            return 0
        driver = next((pf.driver or "" for pf in observed.pfs if pf.pci == action.pci), "")
        learned = 0
        for (vf, attr, value), write in zip(tried, result.writes, strict=True):
            if getattr(write.error, "errno", None) not in _UNSUPPORTED_ERRNOS:
                continue
            if attr == "eswitch.mode" and isinstance(action, SetEswitch) and action.numvfs:
                # Some drivers refuse a mode change only while VFs exist (ice answers
                # EOPNOTSUPP): a failure to report and retry, not a lasting "unsupported".
                continue
            learned += 1
            error = str(write.error)
            key = UnsupportedKey(action.pci, driver, vf, attr, value, error)
            if key not in self.memory.unsupported:
                self.memory.unsupported.add(key)
                log.warning(
                    "vf.attribute-unsupported",
                    obj=action.obj,
                    vf=vf,
                    attr=attr,
                    value=value,
                    driver=driver,
                    error=error,
                )
        return learned

    def _hold_peermem(
        self, action: Action, result: ResultLike, observed: Observed, cause: str
    ) -> bool:
        """A failed peermem load: True when its reason is lasting (then remembered and
        reported, not retried with backoff); False lets it fail as any action does."""
        if not isinstance(action, LoadModule) or action.obj != PEERMEM_OBJ:
            return False
        error = _result_error(action, result)
        head, _, log_part = error.partition(peermem.KERNEL_LOG_SEP)
        facts = observed.modules.peermem
        finding = peermem.diagnose(
            action.module, head, [s for s in log_part.split(" | ") if s], facts
        )
        if not finding.lasting:
            return False
        self.memory.peermem_held = peermem.Held(
            peermem.canonical(action.module), finding, facts.fingerprint()
        )
        self.memory.state.last_errors[action.obj] = {
            "error": finding.describe(),
            "at": self.shared.clock.wall(),
            "failures": 1,
            "errno": _result_errno(result),
        }
        log.warning(
            "peermem.cannot-load",
            module=action.module,
            finding=finding.id,
            evidence=finding.evidence,
            suggestion=finding.suggestion,
        )
        self.reporter.history(
            HistoryEntry(
                self.shared.clock.wall(),
                "failed",
                obj=action.obj,
                what=action.describe(),
                reason=action.reason,
                cause=cause,
                error=finding.describe(),
                errno=_result_errno(result),
                kind=action.kind,
            )
        )
        # Status must show the finding now, not after the next drift pass: plan again.
        self.shared.queue.put(Trigger("followup", f"report why {action.module} cannot load"))
        return True

    def _claim_before_create(self, action: Action) -> None:
        """Write down an rxe link as rdmad's before creating it: a crash right after the
        kernel made it must not leave a link rdmad created but does not know it owns
        (it would never remove it when undeclared). A claim whose link never appeared
        is dropped by ``forget_vanished_rxe`` on the next pass. The claim is a small
        file of its own: saving the whole state here cost as much as the add itself."""
        if isinstance(action, AddRxe) and not self.shared.options.dry_run:
            self.memory.claim_rxe(action.name)

    def _after_success(self, action: Action, cause: str) -> None:
        state = self.memory.state
        clock = self.shared.clock
        if isinstance(action, AddRxe):
            state.managed_rxe.add(action.name)
        elif isinstance(action, DeleteRxe):
            state.managed_rxe.discard(action.name)
        elif isinstance(action, SetNumVfs) and action.new > 0:
            # VFs appear (and get renamed by udev) after the write returns: their
            # uevents trigger the next passes; this deadline says when to stop waiting.
            self.timers.expect(
                action.obj,
                f"{action.new} VFs of {action.pci} to appear after sriov_numvfs -> {action.new}",
                self.shared.options.vf_wait,
            )
        state.applied[action.obj] = {
            "what": action.describe(),
            "at": clock.wall(),
            "reason": action.reason,
            "cause": cause,
        }
        state.last_errors.pop(action.obj, None)

    def fail(
        self,
        action: Action,
        error: str,
        cause: str,
        log_it: bool = True,
        errno: int | None = None,
    ) -> None:
        self.failed_what.setdefault(action.obj, set()).add(action.describe())
        clock = self.shared.clock
        now = clock.monotonic()
        f = self.shared.backoff.fail(action.obj, error, now, clock.wall(), errno)
        self.memory.state.last_errors[action.obj] = {
            "error": error,
            "at": f.wall,
            "failures": f.failures,
            "errno": errno,
        }
        log.warning(
            "object.degraded",
            obj=action.obj,
            error=error,
            failures=f.failures,
            retry_in=round(f.retry_at - now, 3),
        )
        if log_it:
            self.reporter.history(
                HistoryEntry(
                    f.wall,
                    "failed",
                    obj=action.obj,
                    what=action.describe(),
                    reason=action.reason,
                    cause=cause,
                    error=error,
                    errno=errno,
                    kind=action.kind,
                )
            )


class _Crashed(msgspec.Struct, frozen=True):
    """The result of an apply() that raised instead of returning a result."""

    exc: BaseException

    @property
    def ok(self) -> bool:
        return False

    @property
    def writes(self) -> Sequence[WriteLike]:
        return ()

    @property
    def note(self) -> str:
        return f"internal error: {type(self.exc).__name__}: {self.exc}"

    @property
    def stale(self) -> bool:
        return False


def _error_count(result: ResultLike) -> int:
    return sum(1 for w in result.writes if w.error is not None) or (0 if result.ok else 1)


def _result_errno(result: ResultLike) -> int | None:
    """The kernel's errno of the first failed write (what ``_result_error`` names first)."""
    for w in result.writes:
        if w.error is not None:
            code = getattr(w.error, "errno", None)
            return code if isinstance(code, int) else None
    return None


def _result_error(action: Action, result: ResultLike) -> str:
    errors = [str(w.error) for w in result.writes if w.error is not None]
    if errors:
        return "; ".join(errors)
    return result.note or f"{action.describe()} failed"
