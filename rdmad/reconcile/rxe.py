"""Soft-RoCE policy: rxe links created as soon as their netdev exists, moved only when the
new netdev can take them in the same pass, removed only when rdmad made them and nothing
holds them."""

from __future__ import annotations

import ipaddress

from rdmad.model import (
    Action,
    AddRxe,
    Blocked,
    DeleteRxe,
    Desired,
    LoadModule,
    NetdevObserved,
    NetdevRef,
    NotServing,
    Observed,
    PlanState,
    RdmaLinkObserved,
    RxeSpec,
    Waiting,
)
from rdmad.modsupport import RXE

RXE_MODULE = RXE
# How long to wait before looking again at a link with no GID of an IP address: the
# kernel makes the GID of an address added to the netdev from a work queue, after the
# address event, and no event says it did. One look again per pass that found it so;
# never a poll.
GID_RECHECK = 1.0


# --- Soft-RoCE --------------------------------------------------------------------------


def find_netdev(ref: NetdevRef, observed: Observed) -> NetdevObserved | str | None:
    """The netdev a reference names; a string explains an ambiguous match."""
    if ref.name is not None:
        return observed.netdev(ref.name)
    hits = [
        n
        for n in observed.netdevs
        if (ref.mac is not None and ref.mac in (n.perm_mac, n.mac))
        or (ref.pci is not None and n.pci == ref.pci)
    ]
    if len(hits) > 1:
        names = ", ".join(n.name for n in hits)
        return f"{ref.describe()} matches several netdevs ({names})"
    return hits[0] if hits else None


def plan_rxe(desired: Desired, observed: Observed, state: PlanState) -> list[Action]:
    declared = {r.name for r in desired.rxe}
    actions: list[Action] = []
    deleting: set[str] = set()
    # Stale links first: deleting one may free the netdev a declared link needs.
    for name in sorted(state.managed_rxe - declared):
        link = observed.rdma_link(name)
        if link is None or not link.is_rxe:
            continue
        obj = f"rxe {name}"
        if link.usage.busy:
            actions.append(
                Blocked(obj, f"{name} is no longer declared but in use: {link.usage.describe()}")
            )
        else:
            deleting.add(name)
            actions.append(
                DeleteRxe(
                    obj,
                    f"{name} was created by rdmad and is no longer declared",
                    name=name,
                    netdev=link.netdev,
                )
            )
    module_planned = False
    for spec in desired.rxe:
        planned = _plan_one_rxe(spec, observed, state, deleting)
        if any(isinstance(a, AddRxe) for a in planned) and not module_planned:
            if not observed.modules.present(RXE_MODULE):
                # The real reason: no module support, modules_disabled, or no rdma_rxe
                # for the running kernel (rdmad.modsupport); else load it.
                why = observed.modules.cannot_load(RXE_MODULE)
                if why is not None:
                    actions.append(Blocked(spec.obj, why))
                    continue
                actions.append(LoadModule(spec.obj, "rxe links need rdma_rxe", module=RXE_MODULE))
            module_planned = True
        actions.extend(planned)
    return actions


def _plan_one_rxe(
    spec: RxeSpec, observed: Observed, state: PlanState, deleting: set[str]
) -> list[Action]:
    obj = spec.obj
    if not observed.rdma_netlink:
        return [Blocked(obj, "the kernel has no RDMA netlink (NETLINK_RDMA): rxe is unavailable")]
    netdev = find_netdev(spec.netdev, observed)
    if isinstance(netdev, str):
        return [Blocked(obj, netdev)]
    existing = observed.rdma_link(spec.name)
    actions: list[Action] = []
    if existing is not None:
        if existing.driver is None:
            # Listed by RDMA netlink, yet neither netlink nor sysfs can name its driver: a
            # device met in the middle of its creation or teardown. Not "someone else's
            # device" (a false alarm every `rdma link delete`); hands off until it settles.
            return [
                Waiting(
                    obj,
                    f"an RDMA device named {spec.name} exists but its driver cannot be "
                    "read (being created or removed?)",
                )
            ]
        if not existing.is_rxe:
            return [
                Blocked(
                    obj,
                    f"an RDMA device named {spec.name} exists with driver "
                    f"{existing.driver or 'unknown'}; it is not an rxe link and is left alone",
                )
            ]
        if netdev is not None and existing.netdev == netdev.name:
            return _serving(spec, existing)
        where = existing.netdev or "no netdev"
        if spec.name not in state.managed_rxe or existing.usage.busy:
            owner = (
                f"in use: {existing.usage.describe()}"
                if existing.usage.busy
                else "not created by rdmad"
            )
            return [
                Blocked(
                    obj,
                    f"rxe {spec.name} is on {where}, declared on {spec.netdev.describe()}; "
                    f"it is {owner}",
                )
            ]
    if netdev is None:
        if existing is not None:
            # A working link is worth more than a declaration that names nothing (a typo,
            # a rename): delete it only when its replacement can be made in the same pass.
            return [
                Blocked(
                    obj,
                    f"rxe {spec.name} is on {existing.netdev or 'no netdev'}, declared on "
                    f"{spec.netdev.describe()}, which is not present; the working link is kept",
                )
            ]
        return [Waiting(obj, f"{spec.netdev.describe()} is not present")]
    for other in observed.rdma_links:
        if (
            other.is_rxe
            and other.name != spec.name
            and other.netdev == netdev.name
            and other.name not in deleting
        ):
            taken = f"{netdev.name} already carries rxe link {other.name!r} (one per netdev)"
            return [Blocked(obj, taken)]
    if existing is not None:
        actions.append(
            DeleteRxe(
                obj,
                f"{spec.name} is on {existing.netdev or 'no netdev'}, declared on "
                f"{spec.netdev.describe()}",
                name=spec.name,
                netdev=existing.netdev,
            )
        )
    why = "re-create" if existing is not None else "declared rxe link is missing"
    actions.append(AddRxe(obj, why, name=spec.name, netdev=netdev.name))
    return actions


def _serving(spec: RxeSpec, link: RdmaLinkObserved) -> list[Action]:
    """Nothing, when the link as declared can carry traffic as far as a cheap look tells
    (its port ACTIVE, a GID of an IP address); else why not. Unknown (not read) is no
    finding: only what was seen is reported."""
    where = f"rxe {spec.name} on {link.netdev}"
    state = link.port_state
    if state is not None and state != "ACTIVE":
        why = (
            f"{where} cannot carry traffic: its port is {state} "
            f"(it turns ACTIVE when {link.netdev} is up with a carrier)"
        )
        return [NotServing(spec.obj, why)]
    if link.gids is not None and not any(_ip_gid(g) for g in link.gids):
        why = (
            f"{where} cannot carry routed traffic: it has no GID made from an IP address of "
            f"{link.netdev} (rdma_cm and RoCE v2 between hosts address a device by one; "
            f"give {link.netdev} an IPv4 or IPv6 address)"
        )
        return [NotServing(spec.obj, why, recheck=GID_RECHECK, netdev_ifindex=link.netdev_ifindex)]
    return []


def _ip_gid(gid: str) -> bool:
    """A GID made from an IPv4 or a non-link-local IPv6 address (the default GID, made
    from the MAC, and link-local ones are fe80::/10)."""
    try:
        address = ipaddress.IPv6Address(bytes.fromhex(gid.replace(":", "")))
    except ValueError:
        return True  # not a GID as sysfs prints them: nothing to conclude from it
    return address.ipv4_mapped is not None or not address.is_link_local
