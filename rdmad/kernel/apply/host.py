"""KernelHost: apply() actions to the node (observe() is ``kernel.apply.host_observe``'s).

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from rdmad.clock import Clock, sleep_until
from rdmad.kernel import modules as modules_mod
from rdmad.kernel.apply.host_observe import (
    DevlinkSource,
    LinkSource,
    ObservingHost,
    RdmaSource,
)
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
from rdmad.kernel.ibcore import write_options
from rdmad.kernel.openibd_dropin import daemon_reload, sync_dropin
from rdmad.kernel.pause import read_pause
from rdmad.kernel.sysfs import PCI_DEVICES
from rdmad.model import (
    Action,
    AddRxe,
    LoadModule,
    RdmaLinkObserved,
    SetVfSettings,
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


Write = Callable[[], Awaitable[Sequence[KernelError | None] | None]]


# --- the real host ---------------------------------------------------------------------------


class KernelHost(ObservingHost):
    """The one writer to the kernel; what it reads with is ``ObservingHost``'s.

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
        numvfs_deadline: float = NUMVFS_DEADLINE,
        modprobe_timeout: float = modules_mod.DEFAULT_TIMEOUT,
        modprobe_program: str = modules_mod.MODPROBE,
        clock: Clock | None = None,
        reflex: RxeReflex | None = None,
    ) -> None:
        super().__init__(root, rtnl=rtnl, rdma=rdma, devlink=devlink, clock=clock)
        self.numvfs_deadline = numvfs_deadline
        self.modprobe_timeout = modprobe_timeout
        self.modprobe_program = modprobe_program
        self.records = recent_records()  # the last RECORDS_KEPT writes
        self.slow = SlowWrites(self.clock, numvfs_deadline)
        # rxe adds the event readers send themselves (kernel.events.reflex); the daemon wires them.
        if reflex is None and Path(root) == Path("/"):
            reflex = RxeReflex(self.sysfs, self.clock)
        self.reflex = reflex

    def close(self) -> None:
        if self.reflex is not None:
            self.reflex.close()
        super().close()

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
                if isinstance(added, str):
                    why = added
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
        made: Callable[[AddRxe], None],
    ) -> None:
        if self.reflex is not None:
            self.reflex.arm(on_netdev, on_removed, gate, made)

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
        except asyncio.TimeoutError:
            return None
        if failure is not None:
            log.debug("%s: the reflex's add was refused: %s", action.obj, failure)
            return None
        log.debug("%s: added by the reflex (%d sends)", action.obj, firing.sends)
        return self._record(action, w.changes[0], None, self.clock.monotonic() - firing.started)

    async def _add_rxe(self, action: AddRxe, w: PlannedWrite) -> WriteRecord | str:
        """The rxe add, sent again while the kernel still releases an old device of that
        name (see RXE_RELEASE_WAIT); a string: why it is stale (still refused so at the
        end, or its netdev deleted since the observation). Only the last attempt is
        recorded: the refusals before it are the kernel's teardown."""
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
            no_device = error is not None and error.errno == errno_mod.ENODEV
            if no_device and not self.sysfs.netdev_exists(action.netdev):
                # Deleting a netdev takes its rxe device with it; the add planned on that
                # device's removal (a reaction) can reach the kernel before the link news.
                return f"netdev {action.netdev} was deleted"
            if error is None or error.errno not in _RXE_TAKEN:
                break
            if not releasing and not await self._rxe_name_in_release(action):
                break  # a link of that name, or on that netdev, is really there
            releasing = True
            if clock.monotonic() + pause - started > RXE_RELEASE_WAIT:
                return f"RDMA device {action.name} is still being removed by the kernel"
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
            return r.netdev is not None and self.sysfs.netdev_exists(r.netdev)

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
        elif op is Op.ESWITCH:
            if self.devlink is None:
                raise KernelError("set the eSwitch", w.path, None, "no devlink here")
            options = dict(c.split("=", 1) for c in w.value.split())
            await self.devlink.set_eswitch(w.path, **options)
        elif op is Op.RDMA_NETNS:
            rdma = self._rdma_or_raise(f"set the RDMA netns mode {w.value}")
            await rdma.set_netns_mode(w.value)
        elif op is Op.IBCORE_OPTIONS:
            try:
                write_options(self.sysfs, w.value or None)
            except OSError as exc:
                raise KernelError(
                    "write the ib_core option", f"/{w.path}", exc.errno, exc.strerror or ""
                ) from None
        elif op is Op.OPENIBD_DROPIN:
            write = w.value == "write"
            if sync_dropin(self.sysfs, write, guard_command()):
                try:
                    await daemon_reload()
                except KernelError:
                    # Not read by systemd, so not in force: without the file the next
                    # pass writes it and asks again, instead of taking it as current.
                    if write:
                        sync_dropin(self.sysfs, False, guard_command())
                    raise
        elif op is Op.GUARD_HOOK:
            try:
                write_hook(self.sysfs, w.value.split(), guard_command())
            except OSError as exc:
                raise KernelError(
                    "write the guard hook", f"/{w.path}", exc.errno, exc.strerror or ""
                ) from None
        return None

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
