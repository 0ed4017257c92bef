"""plan(): the only place policy lives (``sriov.py`` and ``rxe.py`` hold the rules; this
module puts them together; ``detail/`` reads a plan back per VF and attribute for
status). Pure: no I/O, no clock, no globals.

Given what is declared, what the kernel shows and what rdmad remembers having
created, return the list of actions that moves the node toward the declaration,
in the order they must run. Objects that cannot move say why (``Blocked``) or
what they wait for (``Waiting``).

Rules, each with a test in tests/unit/test_reconcile.py:

* A node that matches its declaration plans nothing (idempotence).
* ``[[sriov]]`` declarations are resolved on the node first (``resolve.py``): selectors
  to the PFs they match (a literal ``pf`` wins over a selector; two selectors on one PF
  are refused there), VF ranges to VFs, derived MACs to literals; the plan, status and
  dry run show the literal values.
* Objects that are not declared are never touched; the only exception is an
  rxe link rdmad itself created (``PlanState.managed_rxe``) that is no longer
  declared, and only when nothing holds it.
* A non-zero VF count changes to another value only through 0, and only when
  no VF is in use; unknown ownership counts as in use.
* VF settings are planned against the VFs the kernel shows, except right after a
  count change: the VFs a numvfs write creates are new (they hold nothing and read
  as the driver's defaults), so their declared rtnetlink settings follow the write
  in the same plan; the next pass re-observes, verifies and plans the rest.
* A VF is re-bound (driver change, new IB GUIDs) only when it is free.
* A VF in use keeps its settings, the InfiniBand port policy among them, unless its
  declaration says ``in_use_drift = "apply"``; the drift is reported.
* rxe links are created as soon as their netdev exists: the kernel accepts a
  netdev that is down and the port turns ACTIVE when it comes up.
* The modprobe.d guard hook guards the drivers of PFs with ``driver_guard`` (and
  rdma_rxe when rxe links are declared); while a guarded stop is in progress nothing
  loads a module or creates an rxe link (``guard.py``).
* The peer-memory module (nvidia-peermem / nvidia-p2p) is loaded when the GPU
  driver and the RDMA core are loaded and it is not, unless a finding says it
  cannot be (``peermem.py``); never unloaded.
* The RDMA netns mode is written to ib_core's modprobe.d option first (it holds from
  the next load on), and changed in the running kernel only while no other network
  namespace is known to exist (``rdmasys.py``). Planned before everything else.
"""

from __future__ import annotations

from rdmad.model import Action, Desired, Observed, ObserveScope, PlanState
from rdmad.reconcile.guard import plan_guard, stand_back
from rdmad.reconcile.peermem import declared as peermem_declared
from rdmad.reconcile.peermem import plan_peermem
from rdmad.reconcile.rdmasys import declared as rdma_declared
from rdmad.reconcile.rdmasys import plan_rdma
from rdmad.reconcile.resolve import find_pf, resolve
from rdmad.reconcile.rxe import RXE_MODULE, find_netdev, plan_rxe
from rdmad.reconcile.sriov import NETLINK_ATTRS, plan_sriov


def plan(desired: Desired, observed: Observed, state: PlanState) -> list[Action]:
    actions: list[Action] = []
    claimed: dict[str, str] = {}  # PF PCI address -> object that declared it
    actions.extend(plan_rdma(desired.rdma, observed))
    resolution = resolve(desired, observed)
    for target in resolution.targets:
        actions.extend(plan_sriov(target, observed, state, claimed))
    actions.extend(o.action for o in resolution.others)
    actions.extend(plan_rxe(desired, observed, state))
    actions.extend(plan_peermem(desired.peermem, observed, state))
    actions.extend(plan_guard(desired, observed))
    return stand_back(actions, observed)


def observe_scope(desired: Desired) -> ObserveScope:
    """What a plan on ``desired`` can ask of the costly sources: rdma_rxe's availability
    only where an rxe link is declared (``rxe.py`` and ``guard.py`` ask it then and only
    then), and the peer-memory facts as far as the mode can turn on them."""
    modules = frozenset({RXE_MODULE}) if desired.rxe else frozenset()
    return ObserveScope(modules=modules, peermem=desired.peermem.mode)


def declared_objects(desired: Desired, observed: Observed | None = None) -> list[str]:
    """The objects status lists. SR-IOV objects depend on the node (a selector's are
    the PFs it matches there): without ``observed``, each declaration's own name."""
    sriov = (
        [s.obj for s in desired.sriov] if observed is None else resolve(desired, observed).objects()
    )
    return (
        sriov
        + [r.obj for r in desired.rxe]
        + peermem_declared(desired.peermem)
        + rdma_declared(desired.rdma)
    )


__all__ = [
    "NETLINK_ATTRS",
    "RXE_MODULE",
    "declared_objects",
    "find_netdev",
    "find_pf",
    "observe_scope",
    "plan",
]
