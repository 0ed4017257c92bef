"""The half of ``KernelHost`` that reads: observe() and the looks an apply re-checks with.

``observe()`` is one consistent snapshot: rtnetlink first, then sysfs, read again when
a netdev moved between them. ``observe_changed()`` is the event path's narrow look: the
news the link events carried, the RDMA links when they may have changed, the rest of
the last snapshot kept. RDMA netlink is read only where it cannot load a module (ib_core
loaded, no guarded stop in progress) and probed once per ib_core load.

A base class of ``KernelHost`` (``kernel.apply.host``), not a separate object: the
apply half re-checks with the same reads (``_fresh_rdma_links``), the same clients and
the same cached probe, and tests drive both through one host.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from msgspec import structs

from rdmad.clock import Clock, SystemClock
from rdmad.kernel import modules as modules_mod
from rdmad.kernel.apply.observe import observe, observe_changed
from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink.devlink import Devlink, PfSeen
from rdmad.kernel.netlink.rdma import RdmaNetlink
from rdmad.kernel.netlink.rtnetlink import RtNetlink
from rdmad.kernel.netlink.rtnl_codec import LinkInfo, parse_link
from rdmad.kernel.netlink.vf_apply import VfChangeResult
from rdmad.kernel.pause import in_force, read_pause, read_pause_record
from rdmad.kernel.peermem_probe import PeermemProbe
from rdmad.kernel.sysfs import Sysfs
from rdmad.kernel.usage.holders import combine, representor_usage
from rdmad.model import (
    Observed,
    ObserveScope,
    RdmaLinkObserved,
    Usage,
    Use,
    VfChange,
    VfObserved,
    VfSettings,
)

# --- what KernelHost needs from netlink (real classes, or fakes in tests) ------------------


class LinkSource(Protocol):
    async def links(self, vfs: bool = True) -> list[LinkInfo]: ...

    async def set_vf_settings(
        self,
        link: int | str,
        changes: Sequence[VfChange],
        current: Mapping[int, VfSettings],
    ) -> list[VfChangeResult]: ...

    async def set_up(self, link: int | str) -> None: ...

    def close(self) -> None: ...


class RdmaSource(Protocol):
    reason: str | None
    lasting: bool  # the last available() answer holds until ib_core comes (not EMFILE)

    def available(self) -> bool: ...

    async def links(self) -> list[RdmaLinkObserved]: ...

    async def add_link(self, name: str, link_type: str, netdev: str) -> None: ...

    async def delete_link(self, name: str) -> None: ...

    async def set_netns_mode(self, mode: str) -> None: ...

    def close(self) -> None: ...


class DevlinkSource(Protocol):
    async def read_pfs(self, pfs: Iterable[tuple[str, str | None]]) -> dict[str, PfSeen]: ...

    async def set_eswitch(
        self,
        pf: str,
        mode: str | None = None,
        inline_mode: str | None = None,
        encap_mode: str | None = None,
    ) -> None: ...

    def close(self) -> None: ...


# --- the reading half ------------------------------------------------------------------------


class ObservingHost:
    """What ``KernelHost`` reads with: sysfs under ``root``, rtnetlink and RDMA netlink.

    ``root`` "/" observes with rtnetlink and RDMA netlink; any other root is a
    sysfs tree and netlink is used only when passed in explicitly (tests).
    """

    def __init__(
        self,
        root: str | Path = "/",
        *,
        rtnl: LinkSource | None = None,
        rdma: RdmaSource | None = None,
        devlink: DevlinkSource | None = None,
        clock: Clock | None = None,
    ) -> None:
        # Deadlines and record times; the waits themselves are asyncio's (real time).
        self.clock: Clock = clock or SystemClock()
        self.sysfs = Sysfs(root)
        live = Path(root) == Path("/")
        self.rtnl: LinkSource | None = rtnl if rtnl is not None else RtNetlink() if live else None
        self.rdma: RdmaSource | None = rdma if rdma is not None else RdmaNetlink() if live else None
        self.devlink: DevlinkSource | None = (
            devlink if devlink is not None else Devlink() if live else None
        )
        self.last: Observed | None = None
        self._rdma_ok: bool | None = None  # cached RDMA netlink probe
        self._rdma_probe_core = False  # whether ib_core was loaded at that probe
        self.peermem_probe = PeermemProbe()  # caches the costly peermem reads
        self.module_probe = modules_mod.ModuleProbe()  # and the module tree's (rdma_rxe)
        self.scope = ObserveScope()  # what the declaration asks of those (all, until told)

    def set_scope(self, scope: ObserveScope) -> None:
        """What the declaration in effect asks of the costly sources (the agent tells it
        at each config load); the next full observation reads for that."""
        self.scope = scope

    def close(self) -> None:
        for client in (self.rtnl, self.rdma, self.devlink):
            if client is not None:
                client.close()

    async def __aenter__(self) -> ObservingHost:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # --- observe ----------------------------------------------------------------------

    async def observe(self) -> Observed:
        """One consistent snapshot: netlink first, then sysfs, retried if a netdev moved between.

        The kernel has no transaction across rtnetlink and sysfs; a netdev renamed
        or created between the two reads shows up as a name only one of them knows.
        Then everything is read again (up to 3 times) rather than mixing two states.
        """
        for _attempt in range(3):
            snapshot, consistent = await self._observe_once()
            if consistent:
                break
        else:
            snapshot = _with_note(snapshot, "netdevs kept changing while being observed")
        self.last = snapshot
        return snapshot

    async def observe_changed(
        self, rdma: bool, links: Mapping[int, bytes | None] | None = None
    ) -> Observed | None:
        """After link or RDMA device events only: the netdevs from the events' news
        (``links``: ifindex -> RTM_NEWLINK payload, None for a deleted link) or, without
        it, read again in one dump without VF lists; with ``rdma`` (or when a netdev
        under an RDMA link went or was renamed), the RDMA links; the rest of the last
        snapshot is kept (``observe.observe_changed``). None: call ``observe()`` instead.

        The event path's cost: an rxe link whose netdev just appeared is added after
        reading the RTM_NEWLINK that announced it, not a dump, a walk of sysfs or /proc.
        News is enough because every change of a link is announced, in order, on the
        stream the news came from: a link's latest news is its state now, or at least as
        new as the snapshot it is applied to (news older than that snapshot's dump is
        followed in the same batch by whatever changed the link since).
        """
        last = self.last
        if last is None or self.rtnl is None or self.rdma is None:
            return None
        # Read once: whether to stand back, and the snapshot's pause.
        pause_record = read_pause_record(self.sysfs, self.clock.wall())
        if in_force(pause_record) is not None:
            return None  # standing back: observe() knows how without RDMA netlink
        news = await self._link_news(links)
        if news is None:
            return None
        changed, gone = news
        # Every netdev's name now: the dump's, or the last snapshot's with the news on it.
        names: dict[int, str] = {}
        if gone is not None:
            names = {n.ifindex: n.name for n in last.netdevs if n.ifindex not in gone}
        names.update((link.ifindex, link.name) for link in changed)
        # A rename or removal under an RDMA link changes that link too (rxe goes with it),
        # and any news of its netdev may change its port's state (up, down, carrier).
        moved = any(
            r.netdev_ifindex is not None and names.get(r.netdev_ifindex) != r.netdev
            for r in last.rdma_links
        )
        under = {r.netdev_ifindex for r in last.rdma_links}
        rdma_links = None
        if rdma or moved or any(link.ifindex in under for link in changed):
            notes: list[str] = []
            rdma_links, _ = await self._rdma_links(notes, paused=False)
            if rdma_links is None or notes:
                return None  # RDMA netlink could not be read: observe() reads sysfs
        snapshot = observe_changed(
            self.sysfs,
            last,
            changed,
            rdma_links,
            gone=gone,
            now=self.clock.wall(),
            pause_record=pause_record,
        )
        if snapshot is not None:
            self.last = snapshot
        return snapshot

    async def _link_news(
        self, links: Mapping[int, bytes | None] | None
    ) -> tuple[list[LinkInfo], frozenset[int] | None] | None:
        """(links changed, ifindexes gone) from the news; with no news, (every link from
        one dump, None). None: neither could be read (observe() then)."""
        if links is None:
            assert self.rtnl is not None
            try:
                return await self.rtnl.links(vfs=False), None
            except KernelError:
                return None
        changed: list[LinkInfo] = []
        try:
            for message in links.values():
                if message is not None:
                    changed.append(parse_link(message))
        except (ValueError, IndexError, KeyError, struct.error):
            return None  # a message this reader does not understand: dump-free no longer
        return changed, frozenset(i for i, m in links.items() if m is None)

    async def _observe_once(self) -> tuple[Observed, bool]:
        links: dict[str, LinkInfo] | None = None
        notes: list[str] = []
        reason = f"VF settings are read over netlink, which cannot see into {self.sysfs.root}"
        if self.rtnl is not None:
            try:
                links = {link.name: link for link in await self.rtnl.links()}
            except KernelError as exc:
                reason = f"rtnetlink could not be read: {exc}"
                notes.append(reason)
        # While a guarded stop runs, no RDMA netlink socket either: opening one makes the
        # kernel load ib_core again the moment the stop has unloaded it. One read of the
        # pause file for that and for the snapshot's pause.
        pause_record = read_pause_record(self.sysfs, self.clock.wall())
        paused = in_force(pause_record) is not None
        rdma_links, rdma_netlink, unread = await self._rdma_read(notes, paused=paused)
        snapshot = observe(
            self.sysfs,
            links,
            rdma_links,
            rdma_netlink=rdma_netlink,
            no_netlink_reason=reason,
            now=self.clock.wall(),
            peermem_probe=self.peermem_probe,
            module_probe=self.module_probe,
            rdma_users_unknown=unread,
            scope=self.scope,
            pause_record=pause_record,
        )
        if notes:
            snapshot = _with_note(snapshot, *notes)
        snapshot = await self._with_devlink(snapshot)
        consistent = links is None or {n.name for n in snapshot.netdevs} <= set(links)
        return snapshot, consistent

    async def _with_devlink(self, snapshot: Observed) -> Observed:
        """Each SR-IOV PF's eSwitch and its VFs' representors, as devlink shows them
        (one dump of devlink instances and one request per PF; the ports only in
        switchdev mode). Without devlink (a sysfs tree) the PFs keep ``eswitch`` None."""
        if self.devlink is None or not snapshot.pfs:
            return snapshot
        seen = await self.devlink.read_pfs((pf.pci, pf.driver) for pf in snapshot.pfs)
        pfs = []
        for pf in snapshot.pfs:
            got = seen.get(pf.pci)
            if got is None:
                pfs.append(pf)
                continue
            vfs = tuple(self._with_representor(v, got, snapshot) for v in pf.vfs)
            pfs.append(structs.replace(pf, eswitch=got.eswitch, vfs=vfs))
        return structs.replace(snapshot, pfs=tuple(pfs))

    def _with_representor(self, vf: VfObserved, seen: PfSeen, snapshot: Observed) -> VfObserved:
        """The VF with its representor netdev and what uses it (gone with the vport)."""
        name = seen.representors.get(vf.index)
        if name is None:
            return structs.replace(vf, representor=None)
        usage = representor_usage(self.sysfs, name, snapshot.rdma_links)
        return structs.replace(vf, representor=name, representor_usage=usage)

    async def _rdma_links(
        self, notes: list[str], *, paused: bool = False
    ) -> tuple[list[RdmaLinkObserved] | None, bool]:
        """RDMA links over netlink when the kernel has it; (None, False) when it never can.

        ``paused``: read from sysfs (None), never opening a socket that could load ib_core.
        """
        links, netlink, _unread = await self._rdma_read(notes, paused=paused)
        return links, netlink

    async def _rdma_read(
        self, notes: list[str], *, paused: bool = False
    ) -> tuple[list[RdmaLinkObserved] | None, bool, str | None]:
        """``_rdma_links`` and, third, why the kernel users of RDMA devices were not read
        where some may exist (ib_core loaded): netlink failed, is missing, or a guarded
        stop stands rdmad back. Links then come from sysfs, their users unknown."""
        if self.rdma is None:
            return None, True, None  # not asked: a sysfs tree
        if not self.sysfs.exists("sys/module/ib_core"):
            # Opening NETLINK_RDMA makes the kernel load ib_core: observing must never
            # load a module. Without ib_core there is no RDMA device to list.
            return (None if paused else []), True, None
        if paused:
            return None, True, "RDMA netlink is not read while a guarded stop is in progress"
        # RdmaNetlink closes its socket after each operation: an open one pins ib_core.
        if not self._rdma_available():
            why = self.rdma.reason or "RDMA netlink is not available"
            notes.append(why)
            return None, False, why
        try:
            return await self.rdma.links(), True, None
        except KernelError as exc:
            notes.append(f"RDMA links read from sysfs: {exc}")
            return None, True, f"RDMA netlink could not be read: {exc}"

    def _rdma_available(self) -> bool:
        """Probe NETLINK_RDMA once, and again only when ib_core has appeared since.

        Opening the socket makes the kernel request ib_core; probing a kernel that
        lacks it on every pass would run a modprobe (by the kernel) each time. A failure
        that may pass (out of descriptors or memory) is not kept: the next pass asks again,
        or one EMFILE would keep rxe links from being made until ib_core came back.
        """
        assert self.rdma is not None
        core = self.sysfs.exists("sys/module/ib_core")
        if self._rdma_ok is None or (not self._rdma_ok and core and not self._rdma_probe_core):
            ok = self.rdma.available()
            self._rdma_ok = ok if ok or self.rdma.lasting else None
            self._rdma_probe_core = core
            return ok
        return self._rdma_ok

    async def _fresh_rdma_links(self) -> list[RdmaLinkObserved]:
        """The RDMA links now, for a re-check; when they cannot be read again, the last
        observation's, with their kernel users unknown if those could exist."""
        paused = read_pause(self.sysfs, self.clock.wall()) is not None
        links, _, unread = await self._rdma_read([], paused=paused)
        if links is not None:
            return links
        last = list(self.last.rdma_links) if self.last is not None else []
        if unread is None:
            return last
        users = Usage(Use.UNKNOWN, (f"kernel users unknown: {unread}",))
        return [replace(r, usage=combine(r.usage, users)) for r in last]


def _with_note(snapshot: Observed, *notes: str) -> Observed:
    return structs.replace(snapshot, notes=(*snapshot.notes, *notes))
