"""The status detail of an rxe link: on the declared netdev or not, and once it is,
whether its consumers can use it (port ACTIVE, a GID of an address); and of an rxe link
only the plan names (one rdmad created that is no longer declared).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rdmad.model import (
    Action,
    AttrStatus,
    NetdevObserved,
    NotServing,
    ObjectDetail,
    ObjectState,
    Observed,
    RxeSpec,
)
from rdmad.reconcile.detail.verdicts import CONVERGED, Verdict, step_verdict
from rdmad.reconcile.rxe import find_netdev


def rxe_detail(spec: RxeSpec, observed: Observed, actions: Sequence[Action]) -> ObjectDetail:
    link = observed.rdma_link(spec.name)
    target = find_netdev(spec.netdev, observed)
    want = target.name if isinstance(target, NetdevObserved) else spec.netdev.describe()
    seen = link.netdev if link is not None else None
    same = link is not None and link.is_rxe and seen == want
    unserving = next((a for a in actions if isinstance(a, NotServing)), None)
    others = [a for a in actions if not isinstance(a, NotServing)]
    state, reason = step_verdict(others, same=same)
    attributes = [AttrStatus("netdev", want, seen, state, reason)]
    if same:
        # Present as declared: can its consumers use it (port ACTIVE, a GID of an address)?
        attributes.append(
            AttrStatus("serving", True, unserving is None, *_serving_verdict(unserving))
        )
    return ObjectDetail(
        kind="rxe",
        desired={"name": spec.name, "netdev": spec.netdev.describe()},
        observed=link_detail(observed, spec.name),
        attributes=tuple(attributes),
    )


def _serving_verdict(unserving: NotServing | None) -> Verdict:
    return CONVERGED if unserving is None else (ObjectState.PENDING, unserving.reason)


def link_detail(observed: Observed, name: str) -> dict[str, Any]:
    link = observed.rdma_link(name)
    if link is None:
        return {}
    return {
        "name": link.name,
        "netdev": link.netdev,
        "usage": link.usage.state.value,
        "port_state": link.port_state,
        "gids": list(link.gids) if link.gids is not None else None,
    }


def undeclared_detail(obj: str, observed: Observed, actions: Sequence[Action]) -> ObjectDetail:
    """An object only the plan names: today an rxe link rdmad created that is no longer
    declared (to be deleted, or kept because it is in use)."""
    kind, _, name = obj.partition(" ")
    if kind != "rxe":
        return ObjectDetail(kind=kind)
    seen = link_detail(observed, name)
    state, reason = step_verdict(actions, same=not seen)
    netdev = AttrStatus("netdev", None, seen.get("netdev"), state, reason)
    return ObjectDetail(kind="rxe", observed=seen, attributes=(netdev,))
