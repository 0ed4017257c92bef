"""Build an ``Observed`` snapshot from sysfs, optionally enriched by netlink.

sysfs alone gives the topology (PFs, VFs, drivers, netdevs, RDMA devices,
modules). VF settings live only in rtnetlink (IFLA_VFINFO_LIST), so the caller
passes what ``RtNetlink.links()`` reported (``LinkInfo`` by netdev name); without
it VF settings are reported as unknown, never guessed. RDMA links come from
``RdmaNetlink.links()`` when given, else from sysfs.

``Observed.rdma_netlink`` is False only when the kernel is known to have no RDMA
netlink, i.e. no rxe link can ever be created on it (the planner then blocks
rxe objects instead of waiting). When nobody asked (a fake tree), it is True.

A listing that usage rests on and that fails (``Unreadable``) makes the VFs it
concerns UNKNOWN, naming why; the planner counts that as in use.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Literal

from msgspec import structs

from rdmad import modsupport, udevdb
from rdmad.kernel.guardhook import driver_module, guard_command, observe_hook
from rdmad.kernel.ibcore import observe_rdma_sys
from rdmad.kernel.managers import with_managers
from rdmad.kernel.modules import ModuleProbe, Modules
from rdmad.kernel.netlink.rtnl_codec import LinkInfo
from rdmad.kernel.openibd_dropin import observe_openibd
from rdmad.kernel.pause import in_force, read_pause_record
from rdmad.kernel.peermem_probe import PeermemProbe
from rdmad.kernel.sysfs import CLASS_IB, CLASS_NET, PCI_DEVICES, OnceReads, Sysfs
from rdmad.kernel.sysfs_files import Unreadable
from rdmad.kernel.usage.holders import (
    Libvirt,
    Namespaces,
    OpenFiles,
    combine,
    rdma_link_usage,
    rdma_links_from_sysfs,
    vf_usage,
)
from rdmad.model.observed import (
    GuardHookObserved,
    IbVfSettings,
    ModulesObserved,
    NetdevObserved,
    Observed,
    ObserveScope,
    PauseObserved,
    PfObserved,
    RdmaLinkObserved,
    Usage,
    Use,
    VfObserved,
)


def observe(
    sysfs: Sysfs,
    links: Mapping[str, LinkInfo] | None = None,
    rdma: Sequence[RdmaLinkObserved] | None = None,
    *,
    rdma_netlink: bool = True,
    no_netlink_reason: str = "netlink was not read",
    now: float | None = None,
    peermem_probe: PeermemProbe | None = None,
    module_probe: ModuleProbe | None = None,
    rdma_users_unknown: str | None = None,
    scope: ObserveScope | None = None,
    pause_record: PauseObserved | Literal["unread"] | None = "unread",
) -> Observed:
    """One snapshot. ``links`` None means rtnetlink was not consulted.

    ``rdma`` is what RDMA netlink listed (driver None where it could not tell:
    sysfs fills it in); None means RDMA devices are read from sysfs.
    ``rdma_users_unknown``: why RDMA netlink was not read although it should have been
    (it failed, or a guarded stop is in progress): the kernel users of the links read
    from sysfs are then unknown, and so each link counts as in use.
    ``scope``: what the declaration asks of the module tree and kallsyms (None: all).
    ``pause_record``: the pause file as the caller already read it for this snapshot
    (``read_pause_record``), not read again; "unread": read here.
    """
    scope = scope or ObserveScope()
    notes: list[str] = []
    netdevs = _netdevs(sysfs, links)
    pf_addresses = sysfs.sriov_pfs()  # one walk of the PCI devices per snapshot
    has_devices = _may_hold_something(sysfs, pf_addresses, notes)
    # Walking /proc is the costliest read; skip it when nothing could be held.
    files = OpenFiles.scan(sysfs) if has_devices else OpenFiles()
    libvirt = Libvirt.scan(sysfs) if has_devices else Libvirt()
    if files.unreadable:
        notes.append(f"open files of {len(files.unreadable)} processes could not be read")
    notes += [why for why in (files.failed, libvirt.failed) if why is not None]
    # RDMA links first: a VF is busy while an RDMA link sits on its netdev.
    blind: Usage | None = None  # why every VF's usage is unknown, if it is
    if rdma is None:
        try:
            rdma_links = rdma_links_from_sysfs(sysfs, files)
        except Unreadable as exc:
            rdma_links = ()
            blind = Usage(Use.UNKNOWN, (f"{exc.reason}: RDMA links on VFs unknown",))
            notes.append(exc.reason)
        if rdma_users_unknown is not None:
            users = Usage(Use.UNKNOWN, (f"kernel users unknown: {rdma_users_unknown}",))
            rdma_links = tuple(replace(r, usage=combine(r.usage, users)) for r in rdma_links)
    else:
        rdma_links = tuple(
            replace(
                r,
                driver=r.driver or sysfs.ib_driver(r.name),
                usage=rdma_link_usage(sysfs, files, r) if has_devices else r.usage,
            )
            for r in rdma
        )
    namespaces = Namespaces(sysfs)  # asks rtnetlink only if a VF's netdev is hidden
    pfs = tuple(
        _pf(
            sysfs,
            pci,
            links=links,
            files=files,
            libvirt=libvirt,
            rdma_links=rdma_links,
            namespaces=namespaces,
            no_netlink_reason=no_netlink_reason,
            blind=blind,
            notes=notes,
        )
        for pci in pf_addresses
    )
    # Other managers' SR-IOV files, read again at each full observation (reload, drift
    # check, a PF's own events): nothing tells when one is edited.
    pfs = with_managers(sysfs, pfs)
    once = OnceReads(sysfs)  # three readers ask about the modules: the kernel, once
    mods = Modules(once)
    level = mods.support()
    why_no_modules = modsupport.support_words(level)
    if why_no_modules is not None:
        notes.append(why_no_modules)
    facts = (peermem_probe or PeermemProbe()).facts(once, scope.peermem)
    loaded = mods.loaded()
    builtin, unavailable = (module_probe or ModuleProbe()).facts(once, loaded, level, scope.modules)
    modules = ModulesObserved(
        loaded, support=level, peermem=facts, builtin=builtin, unavailable=unavailable
    )
    pause_record = _pause_record(sysfs, now, pause_record)
    return Observed(
        netdevs=netdevs,
        pfs=pfs,
        rdma_links=rdma_links,
        modules=modules,
        rdma_netlink=rdma_netlink,
        notes=tuple(notes),
        guard_hook=_guard_hook(sysfs),
        pause=in_force(pause_record),
        pause_record=pause_record,
        rdma_sys=observe_rdma_sys(sysfs),
        machine_id=sysfs.machine_id() if pfs else None,
    )


def _guard_hook(sysfs: Sysfs) -> GuardHookObserved:
    """The modprobe.d hook and openibd.service's drop-in, which goes with it."""
    hook = observe_hook(sysfs)
    return replace(hook, openibd=observe_openibd(sysfs, guard_command()))


def observe_changed(
    sysfs: Sysfs,
    last: Observed,
    links: Sequence[LinkInfo],
    rdma: Sequence[RdmaLinkObserved] | None,
    *,
    gone: Collection[int] | None = None,
    now: float | None = None,
    pause_record: PauseObserved | Literal["unread"] | None = "unread",
) -> Observed | None:
    """A snapshot after link or RDMA device events, from ``last`` (the previous one).

    ``links``: every netdev, read again over rtnetlink (one dump; VF lists not needed);
    or, with ``gone`` (the ifindexes of links deleted since ``last``), only the links
    that changed since (the events' news), the others as ``last`` saw them.
    ``rdma``: RDMA links read again, or None to keep ``last``'s. The pause file and the
    RDMA netns mode are re-read (the pause file unless the caller read it: ``observe``'s
    ``pause_record``); everything else is carried over: no sysfs walk of PCI functions,
    no /proc scan.

    None when the change may reach SR-IOV: a netdev of a PCI function came, went, was
    renamed or changed its address or state; then everything must be read. An RDMA
    link seen before keeps the holders ``last`` saw (combined with what netlink says
    now: a holder is never dropped unseen); nothing here is the last word on usage,
    since every destructive write re-checks it against a fresh scan (kernel.apply.recheck).
    """
    if any(pf.udev_pending for pf in last.pfs):
        return None  # udev's news of that netdev comes with no rtnetlink change to read
    before = {n.ifindex: n for n in last.netdevs}
    # VF representors come and go with the eSwitch mode: one that did tells of a mode
    # change (devlink sends no event for it), which a full observation reads.
    representors = {v.representor for pf in last.pfs for v in pf.vfs if v.representor}
    after: dict[int, NetdevObserved] = {}
    if gone is not None:  # news: start from what did not change
        after = {i: n for i, n in before.items() if i not in gone}
    for link in links:
        old = before.get(link.ifindex)
        if old is not None and old.name == link.name:
            pci = old.pci
            if pci is not None and (old.mac, old.up) != (link.mac, link.up):
                return None  # a PF's or VF's netdev changed
        else:
            pci = None if _virtual(link) else sysfs.netdev_pci(link.name)  # new or renamed
            if pci is not None or (old is not None and old.pci is not None):
                return None
            if (
                old is None
                and not _virtual(link)
                and sysfs.exists(f"{CLASS_NET}/{link.name}/device")
            ):
                return None  # a new netdev of a device that is no PCI function (a representor)
        after[link.ifindex] = NetdevObserved(
            name=link.name,
            ifindex=link.ifindex,
            mac=link.mac,
            perm_mac=link.perm_mac,
            pci=pci,
            up=link.up,
        )
    if any(
        old.pci is not None or old.name in representors
        for i, old in before.items()
        if i not in after
    ):
        return None  # a PCI function's netdev, or a representor, went away
    rdma_links = last.rdma_links if rdma is None else _carry_usage(sysfs, last, rdma)
    pause_record = _pause_record(sysfs, now, pause_record)
    return structs.replace(
        last,
        netdevs=tuple(after.values()),
        rdma_links=rdma_links,
        pause=in_force(pause_record),
        pause_record=pause_record,
        # Two small reads (ib_core may have come back); a pending change's namespaces as
        # the last full observation read them.
        rdma_sys=observe_rdma_sys(sysfs, last.rdma_sys),
    )


# Link kinds that never sit on a device of their own (an ipoib child does: not here).
_SOFTWARE_KINDS = frozenset(
    {"veth", "dummy", "bridge", "bond", "team", "vlan", "macvlan", "ipvlan", "vxlan",
     "geneve", "vrf", "wireguard", "tun", "ifb", "gre", "gretap", "ipip", "sit"}
)  # fmt: skip


def _virtual(link: LinkInfo) -> bool:
    """A software netdev by what rtnetlink said (its kind), so no sysfs read is needed."""
    return link.kind in _SOFTWARE_KINDS and link.parent_dev is None


def _carry_usage(
    sysfs: Sysfs, last: Observed, rdma: Sequence[RdmaLinkObserved]
) -> tuple[RdmaLinkObserved, ...]:
    seen = {(r.name, r.netdev): r.usage for r in last.rdma_links}
    out = []
    for r in rdma:
        usage = seen.get((r.name, r.netdev))
        out.append(
            replace(
                r,
                driver=r.driver or sysfs.ib_driver(r.name),
                usage=r.usage if usage is None else combine(r.usage, usage),
            )
        )
    return tuple(out)


def _netdevs(sysfs: Sysfs, links: Mapping[str, LinkInfo] | None) -> tuple[NetdevObserved, ...]:
    out = []
    for name in sysfs.netdevs():
        facts = links.get(name) if links is not None else None
        if facts is not None:
            out.append(
                NetdevObserved(
                    name=name,
                    ifindex=facts.ifindex,
                    mac=facts.mac,
                    perm_mac=facts.perm_mac,
                    pci=sysfs.netdev_pci(name),
                    up=facts.up,
                )
            )
            continue
        flags = sysfs.read_int(f"sys/class/net/{name}/flags") or 0
        out.append(
            NetdevObserved(
                name=name,
                ifindex=sysfs.read_int(f"sys/class/net/{name}/ifindex") or 0,
                mac=sysfs.netdev_attr(name, "address"),
                perm_mac=None,
                pci=sysfs.netdev_pci(name),
                up=bool(flags & 1),
            )
        )
    return tuple(out)


def _pf(
    sysfs: Sysfs,
    pci: str,
    *,
    links: Mapping[str, LinkInfo] | None,
    files: OpenFiles,
    libvirt: Libvirt,
    rdma_links: Sequence[RdmaLinkObserved],
    namespaces: Namespaces,
    no_netlink_reason: str,
    blind: Usage | None = None,
    notes: list[str] | None = None,
) -> PfObserved:
    fn = sysfs.pci_function(pci)
    assert fn is not None
    netdev = sysfs.own_netdev(fn.netdevs)  # not a representor, not mlx4's second port
    facts = links.get(netdev) if links is not None and netdev is not None else None
    ib_device = fn.ib_devices[0] if fn.ib_devices else None
    settings_note = None
    if links is None:
        settings_note = no_netlink_reason
    elif netdev is None:
        settings_note = "the PF has no netdev"
    elif facts is not None and not facts.vfs_complete:
        settings_note = (
            f"the kernel's VF list for {netdev} is truncated ({len(facts.vfs)} of "
            f"{facts.num_vf} VFs fit one netlink message)"
        )
    vfs = []
    if sysfs.is_netdevsim(pci):
        # netdevsim VFs are indexes with rtnetlink settings, not devices: no driver,
        # nothing can hold them. "netdevsim0/vf1" names them in messages.
        for index in range(fn.numvfs or 0):
            settings = facts.vfs.get(index) if facts is not None else None
            vfs.append(VfObserved(index=index, pci=f"{pci}/vf{index}", settings=settings))
    try:
        virtfns = sysfs.virtfns(pci)
    except Unreadable as exc:
        # Which VFs exist is unknown: each index numvfs says exists reads in use, so
        # that nothing destroys them (the planner blocks a numvfs change on them).
        if notes is not None:
            notes.append(exc.reason)
        unknown = Usage(Use.UNKNOWN, (exc.reason,))
        vfs.extend(VfObserved(index=i, pci=None, usage=unknown) for i in range(fn.numvfs or 0))
        virtfns = {}
    for index, vf_pci in sorted(virtfns.items()):
        vfn = sysfs.pci_function(vf_pci)
        usage = vf_usage(sysfs, files, libvirt, vf_pci, rdma_links, namespaces, fn=vfn)
        settings = facts.vfs.get(index) if facts is not None else None
        ib = None
        if ib_device is not None:
            raw = sysfs.ib_vf(ib_device, index)
            if raw is not None:
                ib = IbVfSettings(**raw)
        vfs.append(
            VfObserved(
                index=index,
                pci=vf_pci,
                driver=vfn.driver if vfn else None,
                driver_override=vfn.driver_override if vfn else None,
                netdev=sysfs.own_netdev(vfn.netdevs) if vfn else None,
                settings=settings,
                ib=ib,
                usage=usage if blind is None else combine(usage, blind),
            )
        )
    vendor, device = sysfs.pci_ids(pci)
    ifindex = facts.ifindex if facts else sysfs.read_int(f"sys/class/net/{netdev}/ifindex")
    operstate_up = facts.up if facts else None
    udev = _udev_pending(sysfs, pci, fn.driver, ifindex, operstate_up)
    return PfObserved(
        pci=pci,
        vendor=vendor,
        device=device,
        driver=fn.driver,
        netdev=netdev,
        ifindex=ifindex,
        mac=facts.mac if facts else (sysfs.netdev_attr(netdev, "address") if netdev else None),
        perm_mac=facts.perm_mac if facts else None,
        numvfs=fn.numvfs or 0,
        totalvfs=fn.totalvfs or 0,
        drivers_autoprobe=fn.drivers_autoprobe,
        autoprobe_unread=fn.autoprobe_unread,
        operstate_up=operstate_up,
        udev_pending=udev.pending,
        udev_unread=udev.unread,
        vfs=tuple(vfs),
        settings_note=settings_note,
        ib_device=ib_device,
        driver_module=driver_module(sysfs, sysfs.device_dir(pci)) if fn.driver else None,
    )


def _udev_pending(
    sysfs: Sysfs, pci: str, driver: str | None, ifindex: int | None, up: bool | None
) -> udevdb.Verdict:
    """Whether udevd runs (its control socket) and has not yet processed the PF: with no
    driver bound, the PCI device (no database entry ``+pci:ADDRESS``: the module its
    modalias names may still be loaded for it); with one, its netdev while that is down
    (no entry ``nIFINDEX``: it has not named it yet). A lookup that fails is unknown,
    which waits; its path goes into the words."""
    if driver is None and not sysfs.is_netdevsim(pci):
        entry = udevdb.pci_entry(pci)
    elif driver is not None and ifindex is not None and up is False:
        entry = udevdb.netdev_entry(ifindex)
    else:
        return udevdb.Verdict(False, None)
    return udevdb.verdict(lambda rel: _lookup(sysfs, rel), entry)


def _lookup(sysfs: Sysfs, rel: str) -> bool | None:
    """Whether ``rel`` exists; None when the lookup fails (not ENOENT): unknown."""
    try:
        return sysfs.present(rel)
    except Unreadable:
        return None


def _pause_record(
    sysfs: Sysfs, now: float | None, given: PauseObserved | Literal["unread"] | None
) -> PauseObserved | None:
    """The pause file as the caller read it for this snapshot, or read now: once."""
    if given == "unread":
        return read_pause_record(sysfs, time.time() if now is None else now)
    return given


def _may_hold_something(sysfs: Sysfs, pf_addresses: list[str], notes: list[str]) -> bool:
    """Whether this node has anything a process or a VM could hold (an SR-IOV PF, an
    RDMA device): only then are /proc and libvirt read. A listing that fails is not
    "nothing here": they are read (a held rxe link must not read free), and it is said."""
    try:
        sysfs.entries(PCI_DEVICES)
        sysfs.entries(CLASS_IB, optional=True)
    except Unreadable as exc:
        notes.append(exc.reason)
        return True
    return bool(pf_addresses or sysfs.ib_devices())
