"""Reactions: what plan() would add the moment one awaited event comes, planned ahead.

A pass that ends with a declared rxe link waiting for its netdev (or present, so the
kernel may remove it) already knows what it would do when that changes: add the link.
``anticipate`` asks plan() itself, on the snapshot with that one change made, and keeps
the answer. When the event comes, the agent applies the answer first and then runs the
pass that checks it: on the event path the add no longer waits for an observation, a
plan and a status publication (bench/RESULTS.md, rxe on the event path).

Only creations are ever armed (``AddRxe``): a reaction never deletes, unbinds or changes
VFs, so what the safety rules guard (usage, ownership) is never decided ahead. Only
netdevs named by name: a MAC or PCI reference needs what a news message does not carry.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import msgspec
from msgspec import structs

from rdmad.model import Action, AddRxe, Desired, NetdevObserved, Observed, PlanState

Planner = Callable[[Desired, Observed, PlanState], list[Action]]

# Each armed reaction costs one plan() per pass; a node declares a handful of rxe links.
MAX_REACTIONS = 16


class Reactions(msgspec.Struct, frozen=True):
    """Actions planned ahead, by the event that makes them due.

    ``on_netdev``: a new netdev of that name appears (a link news "add").
    ``on_rdma_removed``: the kernel removes the RDMA device of that name.
    """

    on_netdev: Mapping[str, tuple[Action, ...]] = msgspec.field(default_factory=dict)
    on_rdma_removed: Mapping[str, tuple[Action, ...]] = msgspec.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.on_netdev or self.on_rdma_removed)

    def due(self, added_netdevs: Iterable[str], removed_rdma: Iterable[str]) -> list[Action]:
        """The actions the events named make due, in order."""
        out: list[Action] = []
        for name in added_netdevs:
            out.extend(self.on_netdev.get(name, ()))
        for name in removed_rdma:
            out.extend(self.on_rdma_removed.get(name, ()))
        return out


NONE = Reactions()


def anticipate(
    desired: Desired,
    observed: Observed,
    state: PlanState,
    planner: Planner,
    planned: list[Action],
) -> Reactions:
    """The reactions for the node as ``observed``, whose plan was ``planned``.

    For each rxe link declared on a netdev by name: if neither exists, what plan()
    adds once a netdev of that name exists; if the link is there on that netdev, what
    plan() adds once the kernel removed it. Armed only when everything the change adds
    to the plan is rxe creations.
    """
    now = [a for a in planned if a.changes_kernel]
    on_netdev: dict[str, tuple[Action, ...]] = {}
    on_removed: dict[str, tuple[Action, ...]] = {}
    for spec in desired.rxe[:MAX_REACTIONS]:
        netdev = spec.netdev.name
        if netdev is None:
            continue
        link = observed.rdma_link(spec.name)
        if link is None and observed.netdev(netdev) is None:
            came = NetdevObserved(name=netdev, ifindex=0)
            after = structs.replace(observed, netdevs=(*observed.netdevs, came))
            target = on_netdev
            key = netdev
        elif link is not None and link.is_rxe and link.netdev == netdev:
            links = tuple(r for r in observed.rdma_links if r.name != spec.name)
            after = structs.replace(observed, rdma_links=links)
            target = on_removed
            key = spec.name
        else:
            continue
        if key in target:
            continue  # two links declared on one netdev: the first one's plan has both
        more = tuple(a for a in planner(desired, after, state) if a.changes_kernel and a not in now)
        if more and all(isinstance(a, AddRxe) for a in more):
            target[key] = target.get(key, ()) + more
    return Reactions(on_netdev, on_removed) if on_netdev or on_removed else NONE
