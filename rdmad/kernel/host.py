"""KernelHost: observe() the node and apply() actions to it; RecordingHost for dry runs.

Every kernel write goes through one method, ``KernelHost._write``: it reads the
old value, performs the change, logs "old -> new" with the action's reason and
appends a ``WriteRecord`` to ``records`` (the agent's history reads it). Nothing
else in rdmad changes the kernel.

``observe_host(root)`` is the synchronous entry used by ``rdmad plan``: a root
other than "/" is a sysfs tree (fake or copied), where netlink would describe the
wrong machine, so VF settings are reported as unknown there; "/" is this host,
read through rtnetlink and (when the kernel has it) RDMA netlink as well.
"""

from __future__ import annotations

import asyncio
import enum
import errno as errno_mod
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from rdmad.kernel import modules as modules_mod
from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink import LinkInfo, RtNetlink, VfChangeResult
from rdmad.kernel.observe import observe
from rdmad.kernel.rdma import RdmaNetlink
from rdmad.kernel.sysfs import PCI_DEVICES, Sysfs
from rdmad.model import (
    Action,
    AddRxe,
    BindVfDriver,
    Blocked,
    DeleteRxe,
    LoadModule,
    Observed,
    RdmaLinkObserved,
    SetIbVf,
    SetLinkUp,
    SetNumVfs,
    SetVfSettings,
    VfChange,
    VfSettings,
    Waiting,
    format_value,
)

log = logging.getLogger("rdmad.kernel")

NUMVFS_DEADLINE = 300.0  # ConnectX-6 Lx: 125 VFs take ~65 s; leave room
PROGRESS_EVERY = 5.0  # log a long write's progress this often
BIND_DEADLINE = 10.0  # asynchronous probing drivers bind after drivers_probe returns
_BIND_POLL = 0.02

# --- results and records ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteRecord:
    """One kernel change rdmad made (or tried to), for logs and the agent's history."""

    at: float  # time.time() when the write finished
    kind: str  # the action kind, e.g. "set-numvfs"
    obj: str  # the declared object, e.g. "sriov pci=0000:3b:00.0"
    target: str  # what was written, e.g. "0000:3b:00.0 sriov_numvfs"
    old: object
    new: object
    reason: str
    error: KernelError | None = None
    seconds: float = 0.0
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        what = f"{self.target}: {format_value(self.old)} -> {format_value(self.new)}"
        if self.dry_run:
            return f"would set {what} ({self.reason})"
        tail = "ok" if self.error is None else f"FAILED: {self.error}"
        return f"{what} ({self.reason}): {tail}"


class Outcome(enum.Enum):
    APPLIED = "applied"  # every change made
    PARTIAL = "partial"  # some changes made, some refused (SetVfSettings, SetIbVf)
    FAILED = "failed"  # nothing made
    NOT_APPLIED = "not-applied"  # Blocked / Waiting: nothing to do by design
    RECORDED = "recorded"  # dry run: what would be done


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What became of one action: its writes (old -> new, error each) and the verdict."""

    action: Action
    outcome: Outcome
    writes: tuple[WriteRecord, ...] = ()
    note: str = ""

    @property
    def ok(self) -> bool:
        """Nothing failed (a dry run and Blocked/Waiting count as ok: nothing was refused)."""
        return self.outcome not in (Outcome.FAILED, Outcome.PARTIAL)

    @property
    def errors(self) -> tuple[KernelError, ...]:
        return tuple(w.error for w in self.writes if w.error is not None)

    def describe(self) -> str:
        head = f"{self.action.describe()}: {self.outcome.value}"
        if self.note:
            head += f" ({self.note})"
        lines = [head, *(f"  {w.describe()}" for w in self.writes if not w.ok)]
        return "\n".join(lines)


def _verdict(action: Action, writes: Sequence[WriteRecord], note: str = "") -> ApplyResult:
    failed = sum(1 for w in writes if w.error is not None)
    if failed == 0:
        outcome = Outcome.APPLIED
    elif failed == len(writes):
        outcome = Outcome.FAILED
    else:
        outcome = Outcome.PARTIAL
    return ApplyResult(action, outcome, tuple(writes), note)


def not_applied(action: Action) -> ApplyResult:
    return ApplyResult(action, Outcome.NOT_APPLIED, note=f"not applied: {action.describe()}")


# --- what KernelHost needs from netlink (real classes, or fakes in tests) ------------------


class LinkSource(Protocol):
    async def links(self) -> list[LinkInfo]: ...

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

    def available(self) -> bool: ...

    async def links(self) -> list[RdmaLinkObserved]: ...

    async def add_link(self, name: str, link_type: str, netdev: str) -> None: ...

    async def delete_link(self, name: str) -> None: ...

    def close(self) -> None: ...


class Host(Protocol):
    """What the agent drives: KernelHost for real, RecordingHost for a dry run."""

    records: list[WriteRecord]

    async def observe(self) -> Observed: ...

    async def apply(self, action: Action) -> ApplyResult: ...


Change = tuple[str, object, object]  # (target, old, new) of one write
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
    ) -> None:
        self.sysfs = Sysfs(root)
        live = Path(root) == Path("/")
        self.rtnl: LinkSource | None = rtnl if rtnl is not None else RtNetlink() if live else None
        self.rdma: RdmaSource | None = rdma if rdma is not None else RdmaNetlink() if live else None
        self.numvfs_deadline = numvfs_deadline
        self.modprobe_timeout = modprobe_timeout
        self.modprobe_program = modprobe_program
        self.records: list[WriteRecord] = []
        self.last: Observed | None = None
        self._rdma_ok: bool | None = None  # cached RDMA netlink probe
        self._rdma_probe_core = False  # whether ib_core was loaded at that probe

    def close(self) -> None:
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
        rdma_links, rdma_netlink = await self._rdma_links(notes)
        snapshot = observe(
            self.sysfs,
            links,
            rdma_links,
            rdma_netlink=rdma_netlink,
            no_netlink_reason=reason,
        )
        if notes:
            snapshot = _with_note(snapshot, *notes)
        consistent = links is None or {n.name for n in snapshot.netdevs} <= set(links)
        return snapshot, consistent

    async def _rdma_links(self, notes: list[str]) -> tuple[list[RdmaLinkObserved] | None, bool]:
        """RDMA links over netlink when the kernel has it; (None, False) when it never can."""
        if self.rdma is None:
            return None, True  # not asked (a sysfs tree): say nothing about rxe
        if not self._rdma_available():
            notes.append(self.rdma.reason or "RDMA netlink is not available")
            return None, False
        try:
            return await self.rdma.links(), True
        except KernelError as exc:
            notes.append(f"RDMA links read from sysfs: {exc}")
            return None, True

    def _rdma_available(self) -> bool:
        """Probe NETLINK_RDMA once, and again only when ib_core has appeared since.

        Opening the socket makes the kernel request ib_core; probing a kernel that
        lacks it on every pass would run a modprobe (by the kernel) each time.
        """
        assert self.rdma is not None
        core = self.sysfs.exists("sys/module/ib_core")
        if self._rdma_ok is None or (not self._rdma_ok and core and not self._rdma_probe_core):
            self._rdma_ok = self.rdma.available()
            self._rdma_probe_core = core
        return self._rdma_ok

    # --- apply ------------------------------------------------------------------------

    async def apply(self, action: Action) -> ApplyResult:
        """Carry out one action; never raises for a kernel refusal (it is in the result)."""
        if isinstance(action, Blocked | Waiting):
            return not_applied(action)
        if isinstance(action, SetNumVfs):
            return await self._set_numvfs(action)
        if isinstance(action, SetLinkUp):
            return await self._set_link_up(action)
        if isinstance(action, SetVfSettings):
            return await self._set_vf_settings(action)
        if isinstance(action, SetIbVf):
            return await self._set_ib_vf(action)
        if isinstance(action, BindVfDriver):
            return await self._bind_vf_driver(action)
        if isinstance(action, LoadModule):
            return await self._load_module(action)
        if isinstance(action, AddRxe):
            return await self._add_rxe(action)
        if isinstance(action, DeleteRxe):
            return await self._delete_rxe(action)
        error = KernelError(action.kind, action.obj, None, "rdmad cannot apply this action kind")
        record = self._record(action, (action.kind, None, None), error, 0.0)
        return _verdict(action, [record])

    async def _write(
        self, action: Action, changes: Sequence[Change], do: Write
    ) -> list[WriteRecord]:
        """THE kernel write: run ``do``, then log and record each change with its result.

        ``do`` returns one error (or None) per change, or None when all succeeded;
        a KernelError it raises fails every change.
        """
        started = time.monotonic()
        try:
            errors: Sequence[KernelError | None] = await do() or [None] * len(changes)
        except KernelError as exc:
            errors = [exc] * len(changes)
        took = time.monotonic() - started
        return [
            self._record(action, change, error, took)
            for change, error in zip(changes, errors, strict=True)
        ]

    def _record(
        self, action: Action, change: Change, error: KernelError | None, took: float
    ) -> WriteRecord:
        target, old, new = change
        record = WriteRecord(
            time.time(), action.kind, action.obj, target, old, new, action.reason, error, took
        )
        self.records.append(record)
        if error is None:
            log.info("%s: %s", action.obj, record.describe())
        else:
            log.warning("%s: %s", action.obj, record.describe())
        return record

    def _sysfs_write(self, rel: str, value: str, op: str) -> Write:
        async def do() -> None:
            self.sysfs.write(rel, value, op=op)

        return do

    # --- SR-IOV count -------------------------------------------------------------------

    async def _set_numvfs(self, action: SetNumVfs) -> ApplyResult:
        rel = f"{self.sysfs.device_dir(action.pci)}/sriov_numvfs"
        old = self.sysfs.read_int(rel)
        change = (f"{action.pci} sriov_numvfs", old, action.new)

        async def do() -> None:
            await self._long_write(rel, str(action.new), f"set sriov_numvfs {action.new}", action)
            now = self.sysfs.read_int(rel)
            if now != action.new:
                raise KernelError(
                    f"set sriov_numvfs {action.new}",
                    rel,
                    None,
                    f"the write returned but sriov_numvfs reads {now}",
                )

        return _verdict(action, await self._write(action, [change], do))

    async def _long_write(self, rel: str, value: str, op: str, action: Action) -> None:
        """A sysfs write that may block for a minute, off the event loop, with a deadline.

        The thread cannot be stopped once the kernel has the write: past the
        deadline the error says so, and the next observe shows how it ended.
        """
        task = asyncio.ensure_future(asyncio.to_thread(self.sysfs.write, rel, value, op=op))
        started = time.monotonic()
        while True:
            left = self.numvfs_deadline - (time.monotonic() - started)
            if left <= 0:
                raise KernelError(
                    op,
                    rel,
                    errno_mod.ETIMEDOUT,
                    f"still running after {self.numvfs_deadline:g} s; the kernel may finish "
                    "it later, the next observation will tell",
                )
            done, _ = await asyncio.wait({task}, timeout=min(PROGRESS_EVERY, left))
            if done:
                task.result()  # raises the KernelError of the write
                return
            log.info(
                "%s: %s still in progress after %.0f s",
                action.obj,
                op,
                time.monotonic() - started,
            )

    # --- VF settings (rtnetlink) ----------------------------------------------------------

    async def _set_vf_settings(self, action: SetVfSettings) -> ApplyResult:
        changes = planned_changes(action)
        rtnl = self.rtnl
        if rtnl is None:
            error = KernelError("set VF settings", action.pf_netdev, None, "no rtnetlink here")
            return _verdict(action, [self._record(action, c, error, 0.0) for c in changes])
        current = await self._current_vfs(action.pci, action.pf_netdev)

        async def do() -> list[KernelError | None]:
            results = await rtnl.set_vf_settings(action.pf_netdev, action.changes, current)
            return [r.error for r in results]

        return _verdict(action, await self._write(action, changes, do))

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

    # --- InfiniBand VF GUIDs --------------------------------------------------------------

    async def _set_ib_vf(self, action: SetIbVf) -> ApplyResult:
        writes: list[WriteRecord] = []
        for c in action.changes:
            file = {"node_guid": "node", "port_guid": "port", "policy": "policy"}.get(c.attr)
            if file is None:
                error = KernelError(f"set vf {c.vf} {c.attr}", action.ib_device, errno_mod.EINVAL)
                writes.append(self._record(action, (c.attr, c.old, c.new), error, 0.0))
                continue
            rel = f"{self.sysfs.ib_vf_dir(action.ib_device, action.vf)}/{file}"
            change = (f"{action.ib_device} vf {action.vf} {c.attr}", self.sysfs.read(rel), c.new)
            op = f"set vf {action.vf} {c.attr}"
            writes += await self._write(action, [change], self._sysfs_write(rel, str(c.new), op))
        if action.rebind and action.vf_pci:
            if any(not w.ok for w in writes):
                return _verdict(action, writes, "not re-bound: a GUID write failed")
            writes += await self._rebind(action, action.vf_pci)
        return _verdict(action, writes)

    async def _rebind(self, action: Action, pci: str) -> list[WriteRecord]:
        """Unbind and re-probe a VF so its driver picks up new GUIDs."""
        driver = self.sysfs.link_name(f"{PCI_DEVICES}/{pci}/driver")
        writes: list[WriteRecord] = []
        if driver is not None:
            writes += await self._unbind(action, pci, driver)
            if not writes[-1].ok:
                return writes
        writes += await self._probe(action, pci, driver, expect=driver)
        return writes

    async def _unbind(self, action: Action, pci: str, driver: str) -> list[WriteRecord]:
        rel = f"sys/bus/pci/drivers/{driver}/unbind"
        change = (f"{pci} driver", driver, None)
        return await self._write(
            action, [change], self._sysfs_write(rel, pci, f"unbind from {driver}")
        )

    async def _probe(
        self, action: Action, pci: str, old: str | None, expect: str | None
    ) -> list[WriteRecord]:
        """drivers_probe, then wait (bounded) for the expected driver to take the device."""
        op = "probe drivers"
        target = f"{pci} driver"

        async def do() -> None:
            self.sysfs.write("sys/bus/pci/drivers_probe", pci, op=op)
            if expect is not None:
                await self._await_driver(pci, expect, op)

        return await self._write(action, [(target, old, expect)], do)

    async def _await_driver(self, pci: str, want: str, op: str) -> None:
        deadline = time.monotonic() + BIND_DEADLINE
        rel = f"{PCI_DEVICES}/{pci}/driver"
        while True:
            now = self.sysfs.link_name(rel)
            if now == want:
                return
            if time.monotonic() >= deadline:
                got = f"bound to {now}" if now else "bound to no driver"
                raise KernelError(
                    op,
                    pci,
                    None,
                    f"{got} {BIND_DEADLINE:g} s after drivers_probe, not {want} "
                    f"(is {want} loaded, and does it claim this device?)",
                )
            await asyncio.sleep(_BIND_POLL)

    # --- VF driver ---------------------------------------------------------------------------

    async def _bind_vf_driver(self, action: BindVfDriver) -> ApplyResult:
        pci, new = action.vf_pci, action.new
        writes: list[WriteRecord] = []
        if not self.sysfs.exists(f"sys/bus/pci/drivers/{new}"):
            writes += await self._modprobe(action, new)
            if not writes[-1].ok:
                return _verdict(action, writes, f"driver {new} is not available")
        base = f"{PCI_DEVICES}/{pci}"
        raw = self.sysfs.read(f"{base}/driver_override")
        override = None if raw in (None, "", "(null)") else raw
        if override != new:
            change = (f"{pci} driver_override", override, new)
            do = self._sysfs_write(f"{base}/driver_override", new, "set driver_override")
            writes += await self._write(action, [change], do)
            if not writes[-1].ok:
                return _verdict(action, writes)
        current = self.sysfs.link_name(f"{base}/driver")
        if current == new:
            return _verdict(action, writes, f"already bound to {new}")
        if current is not None:
            writes += await self._unbind(action, pci, current)
            if not writes[-1].ok:
                return _verdict(action, writes)
        writes += await self._probe(action, pci, current, expect=new)
        return _verdict(action, writes)

    # --- modules ----------------------------------------------------------------------------

    async def _load_module(self, action: LoadModule) -> ApplyResult:
        return _verdict(action, await self._modprobe(action, action.module))

    async def _modprobe(self, action: Action, module: str) -> list[WriteRecord]:
        was = modules_mod.Modules(self.sysfs).is_loaded(module)
        change = (f"module {module}", "loaded" if was else "not loaded", "loaded")

        async def do() -> None:
            await modules_mod.modprobe(
                module,
                sysfs=self.sysfs,
                timeout=self.modprobe_timeout,
                program=self.modprobe_program,
            )

        return await self._write(action, [change], do)

    # --- rxe ----------------------------------------------------------------------------------

    async def _set_link_up(self, action: SetLinkUp) -> ApplyResult:
        change = (f"{action.netdev} link", "down", "up")
        rtnl = self.rtnl

        async def do() -> None:
            if rtnl is None:
                raise KernelError(f"set {action.netdev} up", "", None, "rtnetlink is not open")
            await rtnl.set_up(action.netdev)

        return _verdict(action, await self._write(action, [change], do))

    async def _add_rxe(self, action: AddRxe) -> ApplyResult:
        change = (f"rdma link {action.name}", None, f"rxe on {action.netdev}")
        rdma = self._rdma_or_none()

        async def do() -> None:
            if rdma is None:
                raise self._no_rdma(f"add rxe link {action.name}")
            await rdma.add_link(action.name, "rxe", action.netdev)

        return _verdict(action, await self._write(action, [change], do))

    async def _delete_rxe(self, action: DeleteRxe) -> ApplyResult:
        old = self.last.rdma_link(action.name) if self.last is not None else None
        was = f"rxe on {old.netdev}" if old is not None and old.netdev else "present"
        change = (f"rdma link {action.name}", was, None)
        rdma = self._rdma_or_none()

        async def do() -> None:
            if rdma is None:
                raise self._no_rdma(f"delete RDMA link {action.name}")
            await rdma.delete_link(action.name)

        return _verdict(action, await self._write(action, [change], do))

    def _rdma_or_none(self) -> RdmaSource | None:
        if self.rdma is None or not self.rdma.available():
            return None
        self._rdma_ok = True
        return self.rdma

    def _no_rdma(self, op: str) -> KernelError:
        why = self.rdma.reason if self.rdma is not None else None
        return KernelError(op, "", errno_mod.EPROTONOSUPPORT, why or "no RDMA netlink here")


def _with_note(snapshot: Observed, *notes: str) -> Observed:
    return replace(snapshot, notes=(*snapshot.notes, *notes))


# --- dry run ------------------------------------------------------------------------------------


class RecordingHost:
    """Dry run: observes like the real host, and apply() only records what it would do.

    ``observer`` is any async callable returning an Observed (a KernelHost's
    observe, or a fake); the agent's code path is otherwise the same.
    """

    def __init__(self, observer: Callable[[], Awaitable[Observed]]) -> None:
        self._observer = observer
        self.records: list[WriteRecord] = []
        self.last: Observed | None = None

    async def observe(self) -> Observed:
        self.last = await self._observer()
        return self.last

    async def apply(self, action: Action) -> ApplyResult:
        if not action.changes_kernel:
            return not_applied(action)
        now = time.time()
        records = [
            WriteRecord(now, action.kind, action.obj, t, old, new, action.reason, dry_run=True)
            for t, old, new in planned_changes(action)
        ]
        self.records.extend(records)
        for r in records:
            log.info("%s: dry run: %s", action.obj, r.describe())
        return ApplyResult(action, Outcome.RECORDED, tuple(records), "dry run: nothing changed")


def planned_changes(action: Action) -> list[Change]:
    """(target, old, new) of each write an action stands for, as the planner saw it."""
    if isinstance(action, SetNumVfs):
        return [(f"{action.pci} sriov_numvfs", action.old, action.new)]
    if isinstance(action, SetLinkUp):
        return [(f"{action.netdev} link", "down", "up")]
    if isinstance(action, SetVfSettings):
        return [(f"{action.pf_netdev} vf {c.vf} {c.attr}", c.old, c.new) for c in action.changes]
    if isinstance(action, SetIbVf):
        out: list[Change] = [
            (f"{action.ib_device} vf {action.vf} {c.attr}", c.old, c.new) for c in action.changes
        ]
        if action.rebind:
            out.append((f"{action.vf_pci} driver", "bound", "re-bound"))
        return out
    if isinstance(action, BindVfDriver):
        return [(f"{action.vf_pci} driver", action.old, action.new)]
    if isinstance(action, LoadModule):
        return [(f"module {action.module}", None, "loaded")]
    if isinstance(action, AddRxe):
        return [(f"rdma link {action.name}", None, f"rxe on {action.netdev}")]
    if isinstance(action, DeleteRxe):
        return [(f"rdma link {action.name}", "present", None)]
    return [(action.describe(), None, None)]


# --- the CLI's synchronous entry ------------------------------------------------------------


def observe_host(root: Path) -> Observed:
    """Observe ``root``: a sysfs tree (no netlink), or "/" (this host, with netlink).

    For "/", RDMA devices come from RDMA netlink when the kernel has it, from
    sysfs otherwise; ``rdma_netlink`` is False only when rxe is impossible here.
    """
    if Path(root) != Path("/"):
        return observe(
            Sysfs(root),
            no_netlink_reason=f"VF settings are read over netlink, which cannot see into {root}",
        )

    async def run() -> Observed:
        async with KernelHost("/") as host:
            return await host.observe()

    return asyncio.run(run())


__all__ = [
    "ApplyResult",
    "Host",
    "KernelHost",
    "Outcome",
    "RecordingHost",
    "WriteRecord",
    "observe_host",
    "planned_changes",
]
