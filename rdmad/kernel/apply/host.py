"""KernelHost: observe() the node and apply() actions to it.

An action is carried out as the writes ``kernel.apply.writes.planned_writes`` describes
(the same description a dry run records). Destructive writes are re-checked against
the kernel (current value and usage) before the action's first write, and again right
before each one that follows other writes (``kernel.apply.recheck``). Every kernel write
goes through one method, ``KernelHost._execute``: it performs it off the event loop
with a deadline, logs "old -> new" with the action's reason (at debug when it worked:
the agent logs each change at info, with its cause) and appends a ``WriteRecord`` to
``records`` (which keeps the last ``RECORDS_KEPT``).
Nothing else in rdmad changes the kernel.
"""

from __future__ import annotations

import asyncio
import errno as errno_mod
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from rdmad.clock import Clock, SystemClock, sleep_until
from rdmad.kernel import modules as modules_mod
from rdmad.kernel.apply.observe import observe, observe_changed
from rdmad.kernel.apply.recheck import StaleAction, recheck
from rdmad.kernel.apply.results import (
    ApplyResult,
    Outcome,
    WriteRecord,
    not_applied,
    recent_records,
    verdict,
)
from rdmad.kernel.apply.slowwrite import NUMVFS_DEADLINE, SlowWrites
from rdmad.kernel.apply.writes import Change, Op, PlannedWrite, planned_writes
from rdmad.kernel.errors import KernelError
from rdmad.kernel.events import reflex as reflex_mod
from rdmad.kernel.events.reflex import RxeReflex
from rdmad.kernel.guardhook import guard_command, write_hook
from rdmad.kernel.netlink.rdma import RdmaNetlink
from rdmad.kernel.netlink.rtnetlink import RtNetlink
from rdmad.kernel.netlink.rtnl_codec import LinkInfo, parse_link
from rdmad.kernel.netlink.vf_apply import VfChangeResult
from rdmad.kernel.pause import read_pause
from rdmad.kernel.peermem_probe import PeermemProbe
from rdmad.kernel.sysfs import PCI_DEVICES, Sysfs
from rdmad.kernel.usage.holders import combine
from rdmad.model import (
    Action,
    AddRxe,
    LoadModule,
    Observed,
    RdmaLinkObserved,
    SetVfSettings,
    Usage,
    Use,
    VfChange,
    VfSettings,
)

log = logging.getLogger("rdmad.kernel")

BIND_DEADLINE = 10.0  # asynchronous probing drivers bind after drivers_probe returns
_BIND_POLL = 0.02
# An rxe device's name and its netdev's rxe slot stay taken after its `remove` uevent
# until the driver's dealloc ends (6.1: `ib_dealloc_device` erases it from the device
# table last); it has left the netlink dump and sysfs before that, and no event says
# when it ends. So an add refused for that reason is sent again in place, after pauses
# doubling from RXE_RETRY_FIRST to RXE_RETRY_MAX, each one RDMA netlink request: the link
# is back a few ms after the name is free, not a whole re-planned pass later. Past
# RXE_RELEASE_WAIT it is stale: planned again from a new observation. The pace stays at
# 5 ms (at most ~200 small requests in the whole wait): the release ends at no
# predictable time, and a 20 ms pace added up to 20 ms after it ended (the bench floor
# sends every 1 ms).
RXE_RETRY_FIRST = 0.002
RXE_RETRY_MAX = 0.005
RXE_RELEASE_WAIT = 1.0
_RXE_TAKEN = reflex_mod.TAKEN
# A reflex's add is answered at once, or sent again for at most its RELEASE_WAIT.
REFLEX_WAIT = reflex_mod.RELEASE_WAIT + 1.0


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

    def close(self) -> None: ...


Write = Callable[[], Awaitable[Sequence[KernelError | None] | None]]


# --- the real host ---------------------------------------------------------------------------


class KernelHost:
    """The one writer to the kernel.

    ``root`` "/" observes with rtnetlink and RDMA netlink; any other root is a
    sysfs tree and netlink is used only when passed in explicitly (tests).
    """

    def __init__(
        self,
        root: str | Path = "/",
        *,
        rtnl: LinkSource | None = None,
        rdma: RdmaSource | None = None,
        numvfs_deadline: float = NUMVFS_DEADLINE,
        modprobe_timeout: float = modules_mod.DEFAULT_TIMEOUT,
        modprobe_program: str = modules_mod.MODPROBE,
        clock: Clock | None = None,
        reflex: RxeReflex | None = None,
    ) -> None:
        # Deadlines and record times; the waits themselves are asyncio's (real time).
        self.clock: Clock = clock or SystemClock()
        self.sysfs = Sysfs(root)
        live = Path(root) == Path("/")
        self.rtnl: LinkSource | None = rtnl if rtnl is not None else RtNetlink() if live else None
        self.rdma: RdmaSource | None = rdma if rdma is not None else RdmaNetlink() if live else None
        self.numvfs_deadline = numvfs_deadline
        self.modprobe_timeout = modprobe_timeout
        self.modprobe_program = modprobe_program
        self.records = recent_records()  # the last RECORDS_KEPT writes
        self.last: Observed | None = None
        self._rdma_ok: bool | None = None  # cached RDMA netlink probe
        self._rdma_probe_core = False  # whether ib_core was loaded at that probe
        self.slow = SlowWrites(self.clock, numvfs_deadline)
        self.peermem_probe = PeermemProbe()  # caches the costly peermem reads
        self.module_probe = modules_mod.ModuleProbe()  # and the module tree's (rdma_rxe)
        # rxe adds the event readers send themselves (kernel.events.reflex); the daemon wires them.
        if reflex is None and live:
            reflex = RxeReflex(self.sysfs, self.clock)
        self.reflex = reflex

    def close(self) -> None:
        if self.reflex is not None:
            self.reflex.close()
        for client in (self.rtnl, self.rdma):
            if client is not None:
                client.close()

    async def __aenter__(self) -> KernelHost:
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
        if read_pause(self.sysfs, self.clock.wall()) is not None:
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
            self.sysfs, last, changed, rdma_links, gone=gone, now=self.clock.wall()
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
        # kernel load ib_core again the moment the stop has unloaded it.
        paused = read_pause(self.sysfs, self.clock.wall()) is not None
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
        )
        if notes:
            snapshot = _with_note(snapshot, *notes)
        consistent = links is None or {n.name for n in snapshot.netdevs} <= set(links)
        return snapshot, consistent

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

    # --- apply ------------------------------------------------------------------------

    async def apply(self, action: Action) -> ApplyResult:
        """Carry out one action; never raises for a kernel refusal (it is in the result)."""
        if not action.changes_kernel:
            return not_applied(action)
        planned = planned_writes(action, self.sysfs)
        if not planned:
            error = KernelError(action.kind, action.obj, None, "rdmad cannot apply this action")
            return verdict(action, [self._record(action, (action.kind, None, None), error, 0.0)])
        if isinstance(action, LoadModule) and action.requires:
            mods = modules_mod.Modules(self.sysfs)
            gone = [m for m in action.requires if not mods.is_loaded(m)]
            if gone:
                why = f"{', '.join(gone)} no longer loaded: modprobe would load it back"
                log.info("%s: %s: dropped as stale: %s", action.obj, action.describe(), why)
                return ApplyResult(action, Outcome.STALE, (), f"stale: {why}")
        # Re-check before the action's first write, so a stale action writes nothing at all
        # (not even the driver_override that precedes an unbind).
        try:
            destructive = [w for w in planned if w.destructive]
            links = await self._fresh_rdma_links() if destructive else []
            for w in destructive:
                recheck(w, self.sysfs, links)
            if any(w.brings_back for w in planned):
                pause = read_pause(self.sysfs, self.clock.wall())
                if pause is not None:  # began after the plan was made
                    raise StaleAction(f"a guarded stop began: {pause.describe()}")
        except StaleAction as exc:
            log.info("%s: %s: dropped as stale: %s", action.obj, action.describe(), exc)
            return ApplyResult(action, Outcome.STALE, (), f"stale: {exc}")
        writes: list[WriteRecord] = []
        for i, w in enumerate(planned):
            if w.needs_previous and not all(r.ok for r in writes):
                # override -> unbind -> probe, GUIDs -> rebind: each needs the one before.
                skipped = ", ".join(c[0] for p in planned[i:] for c in p.changes)
                return verdict(action, writes, f"not done after a failed write: {skipped}")
            if w.destructive and writes:
                # The writes before it took time (a modprobe up to its timeout, a driver's
                # GUID store): a VM may have taken the VF since. Look again right before.
                try:
                    recheck(w, self.sysfs, await self._fresh_rdma_links())
                except StaleAction as exc:
                    return self._stale_midway(action, writes, planned[i:], exc)
            if isinstance(action, AddRxe):
                added = await self._add_rxe(action, w)
                if added is None:
                    why = f"RDMA device {action.name} is still being removed by the kernel"
                    log.info("%s: %s: dropped as stale: %s", action.obj, action.describe(), why)
                    return ApplyResult(action, Outcome.STALE, (), f"stale: {why}")
                writes.append(added)
                continue
            writes += await self._execute(action, w)
        return verdict(action, writes)

    def _stale_midway(
        self,
        action: Action,
        writes: list[WriteRecord],
        left: Sequence[PlannedWrite],
        exc: StaleAction,
    ) -> ApplyResult:
        """Stale at a destructive write after earlier ones ran: it and the rest are not
        done; the writes made are in the result (and records) for history to show."""
        skipped = ", ".join(c[0] for p in left for c in p.changes)
        why = f"{exc} (not done: {skipped})"
        log.info("%s: %s: dropped as stale: %s", action.obj, action.describe(), why)
        return ApplyResult(action, Outcome.STALE, tuple(writes), f"stale: {why}")

    # --- reflexes (kernel.events.reflex): armed by the agent at rest, disarmed by its next pass ---

    def arm_reflexes(
        self,
        on_netdev: Mapping[str, Sequence[AddRxe]],
        on_removed: Mapping[str, Sequence[AddRxe]],
        gate: Callable[[AddRxe], bool],
    ) -> None:
        if self.reflex is not None:
            self.reflex.arm(on_netdev, on_removed, gate)

    def disarm_reflexes(self) -> None:
        if self.reflex is not None:
            self.reflex.disarm()

    async def reflexes_answered(self) -> None:
        if self.reflex is not None:
            await self.reflex.answered(REFLEX_WAIT)

    async def _reflex_outcome(self, action: AddRxe, w: PlannedWrite) -> WriteRecord | None:
        """The add a reflex already made for this action, recorded; None: none was sent,
        or the kernel refused it (then the add is sent again, below, and the refusal
        reported is that fresh one, handled as any other)."""
        firing = self.reflex.take(action) if self.reflex is not None else None
        if firing is None:
            return None
        try:
            failure = await asyncio.wait_for(asyncio.shield(firing.outcome), REFLEX_WAIT)
        except TimeoutError:
            return None
        if failure is not None:
            log.debug("%s: the reflex's add was refused: %s", action.obj, failure)
            return None
        log.debug("%s: added by the reflex (%d sends)", action.obj, firing.sends)
        return self._record(action, w.changes[0], None, self.clock.monotonic() - firing.started)

    async def _add_rxe(self, action: AddRxe, w: PlannedWrite) -> WriteRecord | None:
        """The rxe add, sent again while the kernel still releases an old device of that
        name (see RXE_RELEASE_WAIT); None: still refused so at the end (stale). Only the
        last attempt is recorded: the refusals before it are the kernel's teardown."""
        done = await self._reflex_outcome(action, w)
        if done is not None:
            return done
        clock = self.clock
        started = clock.monotonic()
        pause = RXE_RETRY_FIRST
        releasing = False  # the refusal was checked against a fresh list once
        while True:
            error: KernelError | None = None
            try:
                await self._run(action, w)
            except KernelError as exc:
                error = exc
            if error is None or error.errno not in _RXE_TAKEN:
                break
            if not releasing and not await self._rxe_name_in_release(action):
                break  # a link of that name, or on that netdev, is really there
            releasing = True
            if clock.monotonic() + pause - started > RXE_RELEASE_WAIT:
                return None
            await sleep_until(clock, clock.monotonic() + pause)
            pause = min(pause * 2, RXE_RETRY_MAX)
        if releasing:
            waited = round((clock.monotonic() - started) * 1000, 1)
            log.debug("%s: added after the old device's release (%s ms)", action.obj, waited)
        return self._record(action, w.changes[0], error, clock.monotonic() - started)

    async def _rxe_name_in_release(self, action: AddRxe) -> bool:
        """An rxe add refused as existing while no such link is listed: the kernel is
        still unregistering the old one (its events come before the name is free).
        Not a failure to back off from: send it again in a moment."""
        links = await self._fresh_rdma_links()

        def live(r: RdmaLinkObserved) -> bool:  # on a netdev that still exists
            return r.netdev is not None and self.sysfs.exists(f"sys/class/net/{r.netdev}")

        # A link of that name whose netdev is gone is one the kernel is tearing down.
        return not any(
            (r.name == action.name and live(r)) or r.netdev == action.netdev for r in links
        )

    async def _execute(self, action: Action, w: PlannedWrite) -> list[WriteRecord]:
        """THE kernel write: run it, then log and record each change with its result."""
        started = self.clock.monotonic()
        try:
            errors: Sequence[KernelError | None] = await self._run(action, w) or [None] * len(
                w.changes
            )
        except KernelError as exc:
            errors = [exc] * len(w.changes)
        took = self.clock.monotonic() - started
        return [
            self._record(action, change, error, took)
            for change, error in zip(w.changes, errors, strict=True)
        ]

    def _record(
        self, action: Action, change: Change, error: KernelError | None, took: float
    ) -> WriteRecord:
        target, old, new = change
        record = WriteRecord(
            self.clock.wall(), action.kind, action.obj, target, old, new, action.reason, error, took
        )
        self.records.append(record)
        if error is None:  # the agent logs each change at info, with its cause
            log.debug("%s: %s", action.obj, record.describe())
        else:
            log.warning("%s: %s", action.obj, record.describe())
        return record

    async def _run(self, action: Action, w: PlannedWrite) -> Sequence[KernelError | None] | None:
        op = w.op
        if op is Op.NUMVFS:
            await self.slow.write(
                self.sysfs, w.path, w.value, f"set sriov_numvfs {w.value}", action.obj
            )
            now = self.sysfs.read_int(w.path)
            if now != int(w.value):
                raise KernelError(
                    f"set sriov_numvfs {w.value}",
                    w.path,
                    None,
                    f"the write returned but sriov_numvfs reads {now}",
                )
        elif op is Op.SYSFS:
            target = w.changes[0][0]
            await self.slow.write(self.sysfs, w.path, w.value, f"set {target}", action.obj)
        elif op is Op.UNBIND:
            rel = f"sys/bus/pci/drivers/{w.path}/unbind"
            await self.slow.write(self.sysfs, rel, w.value, f"unbind from {w.path}", action.obj)
        elif op is Op.PROBE:
            op_name = "probe drivers"
            await self.slow.write(
                self.sysfs, "sys/bus/pci/drivers_probe", w.path, op_name, action.obj
            )
            if w.value:
                await self._await_driver(w.path, w.value, op_name)
        elif op is Op.MODPROBE:
            await modules_mod.modprobe(
                w.path,
                sysfs=self.sysfs,
                timeout=self.modprobe_timeout,
                program=self.modprobe_program,
            )
        elif op is Op.LINK_UP:
            if self.rtnl is None:
                raise KernelError(f"set {w.path} up", "", None, "rtnetlink is not open")
            await self.rtnl.set_up(w.path)
        elif op is Op.VF_SETTINGS:
            assert isinstance(action, SetVfSettings)
            return await self._set_vf_settings(action)
        elif op is Op.RXE_ADD:
            rdma = self._rdma_or_raise(f"add rxe link {w.path}")
            await rdma.add_link(w.path, "rxe", w.value)
        elif op is Op.RXE_DEL:
            rdma = self._rdma_or_raise(f"delete RDMA link {w.path}")
            await rdma.delete_link(w.path)
        elif op is Op.GUARD_HOOK:
            try:
                write_hook(self.sysfs, w.value.split(), guard_command())
            except OSError as exc:
                raise KernelError(
                    "write the guard hook", f"/{w.path}", exc.errno, exc.strerror or ""
                ) from None
        return None

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

    # --- VF settings (rtnetlink) ----------------------------------------------------------

    async def _set_vf_settings(self, action: SetVfSettings) -> list[KernelError | None]:
        rtnl = self.rtnl
        if rtnl is None:
            error = KernelError("set VF settings", action.pf_netdev, None, "no rtnetlink here")
            return [error] * len(action.changes)
        current = await self._current_vfs(action.pci, action.pf_netdev)
        # By ifindex: a rename between observe and now must not redirect the write.
        link: int | str = action.pf_ifindex if action.pf_ifindex else action.pf_netdev
        results = await rtnl.set_vf_settings(link, action.changes, current)
        return [r.error for r in results]

    async def _current_vfs(self, pci: str, netdev: str) -> Mapping[int, VfSettings]:
        """VF settings the changes are relative to (vlan/qos/proto and rates travel together).

        The planner's snapshot is the truth the action was made from; only without
        one is the PF read again.
        """
        if self.last is not None:
            for pf in self.last.pfs:
                if pf.pci == pci:
                    return {v.index: v.settings for v in pf.vfs if v.settings is not None}
        if self.rtnl is not None:
            try:
                for link in await self.rtnl.links():
                    if link.name == netdev:
                        return link.vfs
            except KernelError:
                pass
        return {}

    async def _await_driver(self, pci: str, want: str, op: str) -> None:
        deadline = self.clock.monotonic() + BIND_DEADLINE
        rel = f"{PCI_DEVICES}/{pci}/driver"
        while True:
            now = self.sysfs.link_name(rel)
            if now == want:
                return
            if self.clock.monotonic() >= deadline:
                got = f"bound to {now}" if now else "bound to no driver"
                raise KernelError(
                    op,
                    pci,
                    None,
                    f"{got} {BIND_DEADLINE:g} s after drivers_probe, not {want} "
                    f"(is {want} loaded, and does it claim this device?)",
                )
            await asyncio.sleep(_BIND_POLL)

    # --- rxe ----------------------------------------------------------------------------------

    def _rdma_or_raise(self, op: str) -> RdmaSource:
        if self.rdma is not None and self._rdma_ok and self.sysfs.exists("sys/module/ib_core"):
            return self.rdma  # probed since ib_core was loaded: no second socket per write
        if self.rdma is None or not self.rdma.available():
            why = self.rdma.reason if self.rdma is not None else None
            raise KernelError(op, "", errno_mod.EPROTONOSUPPORT, why or "no RDMA netlink here")
        self._rdma_ok = True
        return self.rdma


def _with_note(snapshot: Observed, *notes: str) -> Observed:
    return replace(snapshot, notes=(*snapshot.notes, *notes))


__all__ = ["KernelHost"]
