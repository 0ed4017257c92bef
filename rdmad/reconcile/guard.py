"""The driver guard's hook and the pause, as plan rules (pure).

* ``plan_guard``: rdmad's modprobe.d hook guards the module of every PF declared with
  ``driver_guard = true`` (the default) and, when rxe links are declared, ``rdma_rxe``
  (refused while a link has users; an allowed unload makes rdmad stand back). A guarded
  PF whose driver cannot be seen now (unloaded, the PF absent) keeps what the file
  guards: unknown never drops a guard. A built-in driver cannot be unloaded: nothing
  to guard. No declared guard: the file is removed. MOFED/DOCA's openibd.service gets
  rdmad's drop-in (its stop asks the guard first, then runs what the unit runs) only
  while the hook guards something and the unit's own ExecStop= can be read; when it
  cannot, none is written (a note says why) and a stale one is removed.
* ``stand_back``: while a guarded stop is in progress (``Observed.pause``) every action
  that would load a module or create an rxe link waits instead, saying who paused;
  everything else (VF counts and settings, stale-link cleanup) goes on.
"""

from __future__ import annotations

from rdmad.model import (
    Action,
    AddRxe,
    BindVfDriver,
    Desired,
    LoadModule,
    Note,
    Observed,
    OpenibdObserved,
    PfObserved,
    SetRdmaNetnsMode,
    SyncGuardHook,
    SyncOpenibdDropin,
    Waiting,
)
from rdmad.reconcile.resolve import find_pf, resolve
from rdmad.reconcile.rxe import RXE_MODULE

GUARD_OBJ = "guard"


def guarded_modules(desired: Desired, observed: Observed) -> tuple[frozenset[str], bool]:
    """(modules the hook must guard, whether a guarded PF's driver is unknown now)."""
    want: set[str] = set()
    unknown = False
    for target in resolve(desired, observed).targets:
        if not target.spec.driver_guard:
            continue
        pf = find_pf(target.ref, observed)
        if not isinstance(pf, PfObserved) or pf.driver is None:
            unknown = True
        elif pf.driver_module is not None:
            want.add(pf.driver_module)
    # rdma_rxe only where it is a module: built in, or on a kernel without module support,
    # it can never be unloaded and there is nothing to guard (a `remove` line for it would
    # only be noise in modprobe.d).
    if (
        desired.rxe
        and observed.modules.support != "none"
        and RXE_MODULE not in observed.modules.builtin
    ):
        want.add(RXE_MODULE)
    return frozenset(want), unknown


def plan_guard(desired: Desired, observed: Observed) -> list[Action]:
    hook = observed.guard_hook
    if hook is None:
        return []
    want, unknown = guarded_modules(desired, observed)
    if unknown:
        want |= hook.modules
    actions = _openibd(bool(want), hook.openibd)
    if want == hook.modules and (hook.current or not hook.present):
        return actions
    if not want and not hook.present:
        return actions
    if want:
        reason = f"`modprobe -r {' / '.join(sorted(want))}` must ask the guard first"
    else:
        reason = "no PF is declared with driver_guard and no rxe link: nothing to guard"
    sync = SyncGuardHook(
        GUARD_OBJ, reason, modules=tuple(sorted(want)), old=tuple(sorted(hook.modules))
    )
    return [sync, *actions]


def _openibd(guarded: bool, seen: OpenibdObserved) -> list[Action]:
    """openibd.service's drop-in: there exactly while something is guarded and the unit's
    own stop is known, and as the unit's files make it now."""
    if guarded and seen.unit and seen.unknown:
        note = Note(
            GUARD_OBJ,
            f"openibd.service: what its stop runs cannot be known ({seen.unknown}), so no "
            "drop-in makes `systemctl stop openibd` ask the guard first (`modprobe -r` of a "
            "guarded module still does)",
        )
        if seen.dropin == "absent":
            return [note]
        return [note, SyncOpenibdDropin(GUARD_OBJ, "a drop-in from older files", write=False)]
    if guarded and seen.unit:
        if seen.dropin == "current":
            return []
        why = (
            "`systemctl stop|restart openibd` must ask the guard first"
            if seen.dropin == "absent"
            else "openibd.service's own stop changed (or the drop-in was edited)"
        )
        return [SyncOpenibdDropin(GUARD_OBJ, why, write=True)]
    if seen.dropin == "absent":
        return []
    why = "nothing is guarded" if not guarded else "openibd.service is gone"
    return [SyncOpenibdDropin(GUARD_OBJ, why, write=False)]


def stand_back(actions: list[Action], observed: Observed) -> list[Action]:
    pause = observed.pause
    if pause is None:
        return actions
    out: list[Action] = []
    for a in actions:
        # An RDMA netlink request (the netns mode) would make the kernel load ib_core too.
        brings_back = isinstance(a, LoadModule | AddRxe | SetRdmaNetnsMode)
        if brings_back or (isinstance(a, BindVfDriver) and a.load_module):
            out.append(Waiting(a.obj, f"{a.describe()}: held back, {pause.describe()}"))
        else:
            out.append(a)
    return out
