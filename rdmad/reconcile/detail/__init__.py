"""Status detail per object, per VF and per attribute (docs/API.md ``/v1/status``):
what is declared, what the kernel shows, and what the plan says about each.

Pure: no I/O, no clock. It decides nothing itself: the plan already did. It only points
each action at the attributes and VFs it is about, and compares declared with observed
values through the planner's own helpers, so status and plan never disagree on what
"converged" means. ``Describer`` remembers its last answer (no globals, no clock), so a
node at rest costs a comparison per pass rather than a new detail.

* ``sriov``: a PF's VF count, its VFs and their attributes (and the driver guard);
* ``rxe``: an rxe link, declared or only planned (to delete or keep);
* ``peermem``: the peer-memory module and its findings;
* ``rdmasys``: the RDMA netns mode, live and at ib_core's next load;
* ``verdicts``: a state and its reason, the worst of several.
"""

from __future__ import annotations

from collections.abc import Sequence

from rdmad.model import Action, Desired, ObjectDetail, Observed
from rdmad.reconcile.detail.peermem import peermem_detail
from rdmad.reconcile.detail.rdmasys import rdma_detail
from rdmad.reconcile.detail.rxe import rxe_detail, undeclared_detail
from rdmad.reconcile.detail.sriov import sriov_detail
from rdmad.reconcile.peermem import OBJ as PEERMEM_OBJ
from rdmad.reconcile.peermem import declared as peermem_declared
from rdmad.reconcile.rdmasys import OBJ as RDMA_OBJ
from rdmad.reconcile.resolve import resolve

__all__ = ["Describer", "describe"]


def describe(
    desired: Desired, observed: Observed, actions: Sequence[Action]
) -> dict[str, ObjectDetail]:
    """Detail of every declared object and of every other object the plan names (e.g. an
    rxe link rdmad created that is no longer declared), keyed by object name."""
    mine: dict[str, list[Action]] = {}
    for action in actions:
        mine.setdefault(action.obj, []).append(action)
    out: dict[str, ObjectDetail] = {}
    resolution = resolve(desired, observed)
    for target in resolution.targets:
        out[target.obj] = sriov_detail(target, observed, mine.get(target.obj, ()))
    for other in resolution.others:
        out[other.obj] = ObjectDetail(kind="sriov", desired=other.desired)
    for rxe in desired.rxe:
        out[rxe.obj] = rxe_detail(rxe, observed, mine.get(rxe.obj, ()))
    if PEERMEM_OBJ in mine or PEERMEM_OBJ in peermem_declared(desired.peermem):
        out[PEERMEM_OBJ] = peermem_detail(desired, observed, mine.get(PEERMEM_OBJ, ()))
    if RDMA_OBJ in mine or desired.rdma.netns_mode is not None:
        out[RDMA_OBJ] = rdma_detail(desired, observed, mine.get(RDMA_OBJ, ()))
    for obj, acts in mine.items():
        if obj not in out:
            out[obj] = undeclared_detail(obj, observed, acts)
    return out


class Describer:
    """``describe`` that answers again from its last result while nothing it reads has
    changed: a node at rest is re-observed on every drift tick and unrelated event, and
    comparing two observations costs a fraction of describing one (bench/bench_detail.py).
    """

    def __init__(self) -> None:
        self._last: tuple[Desired, Observed, list[Action], dict[str, ObjectDetail]] | None = None

    def __call__(
        self, desired: Desired, observed: Observed, actions: Sequence[Action]
    ) -> dict[str, ObjectDetail]:
        last = self._last
        # The config in force is replaced, never changed in place: identity suffices.
        if (
            last is not None
            and last[0] is desired
            and last[2] == list(actions)
            and last[1] == observed
        ):
            return last[3]
        details = describe(desired, observed, actions)
        self._last = (desired, observed, list(actions), details)
        return details
