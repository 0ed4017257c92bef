"""A model of the kernel for planner tests: applies actions to an ``Observed``.

It enforces the kernel rules the planner must respect (a non-zero VF count
cannot change to another non-zero count: EBUSY; numvfs above totalvfs: ERANGE;
one rxe per netdev: EEXIST) and records every VF that an action destroyed
while it was in use, so property tests can assert that never happens.
"""

from __future__ import annotations

import errno

from rdmad.model import (
    NO_DRIVER,
    Action,
    AddRxe,
    BindVfDriver,
    DeleteRxe,
    IbVfSettings,
    LoadModule,
    Observed,
    PfObserved,
    RdmaLinkObserved,
    SetEswitch,
    SetIbVf,
    SetLinkUp,
    SetNumVfs,
    SetVfSettings,
    VfObserved,
    VfSettings,
)
from tests.support.records import replace

ZERO_GUID = "00:00:00:00:00:00:00:00"


def _eswitch(pf: PfObserved, action: SetEswitch) -> PfObserved:
    if pf.eswitch is None or pf.eswitch.mode is None:
        raise SimError(errno.EOPNOTSUPP, f"{pf.pci} has no eSwitch")
    now = {option: new for option, _, new in action.changes}
    return replace(pf, eswitch=replace(pf.eswitch, **now))


class SimError(Exception):
    def __init__(self, code: int, what: str) -> None:
        self.code = code
        super().__init__(f"{errno.errorcode[code]}: {what}")


class SimKernel:
    def __init__(self, observed: Observed) -> None:
        self.observed = observed
        self.hurt: list[str] = []  # in-use things an action destroyed

    def apply_all(self, actions: list[Action]) -> None:
        for action in actions:
            if action.changes_kernel:
                self.apply(action)

    def apply(self, action: Action) -> None:
        o = self.observed
        if isinstance(action, SetNumVfs):
            self._replace_pf(action.pci, lambda pf: self._numvfs(pf, action))
        elif isinstance(action, SetEswitch):
            if any(option == "mode" for option, _, _ in action.changes):
                # A mode change re-creates every VF's vport under its user.
                self.hurt.extend(
                    f"{v.pci} vport re-created while in use"
                    for pf in o.pfs
                    if pf.pci == action.pci
                    for v in pf.vfs
                    if v.vport_busy  # the VF's user, or its representor's
                )
            self._replace_pf(action.pci, lambda pf: _eswitch(pf, action))
        elif isinstance(action, SetLinkUp):
            self.observed = replace(
                o,
                pfs=tuple(
                    replace(pf, operstate_up=True) if pf.netdev == action.netdev else pf
                    for pf in o.pfs
                ),
            )
        elif isinstance(action, SetVfSettings):
            # Rewriting an in-use VF's settings resets it on several drivers.
            self.hurt.extend(
                f"{v.pci} settings rewritten while in use"
                for pf in o.pfs
                if pf.pci == action.pci
                for v in pf.vfs
                if v.usage.busy and any(c.vf == v.index for c in action.changes)
            )
            self._replace_pf(action.pci, lambda pf: _settings(pf, action))
        elif isinstance(action, SetIbVf):
            self._replace_pf(action.pci, lambda pf: _ib(pf, action, self.hurt))
        elif isinstance(action, BindVfDriver):
            self.hurt.extend(
                f"{v.pci} rebound"
                for pf in o.pfs
                for v in pf.vfs
                if v.pci == action.vf_pci and v.usage.busy
            )
            self.observed = replace(
                o,
                pfs=tuple(
                    replace(
                        pf,
                        vfs=tuple(
                            replace(
                                v,
                                driver=None if action.new == NO_DRIVER else action.new,
                                driver_override=action.new,
                            )
                            if v.pci == action.vf_pci
                            else v
                            for v in pf.vfs
                        ),
                    )
                    for pf in o.pfs
                ),
            )
        elif isinstance(action, LoadModule):
            self.observed = replace(
                o,
                modules=replace(o.modules, loaded=o.modules.loaded | {action.module}),
            )
        elif isinstance(action, AddRxe):
            if o.rdma_link(action.name) is not None:
                raise SimError(errno.EEXIST, f"rdma device {action.name} exists")
            if any(r.is_rxe and r.netdev == action.netdev for r in o.rdma_links):
                raise SimError(errno.EEXIST, f"{action.netdev} already has an rxe link")
            if o.netdev(action.netdev) is None:
                raise SimError(errno.ENODEV, action.netdev)
            if "rdma_rxe" not in o.modules.loaded:
                raise SimError(errno.EOPNOTSUPP, "rdma_rxe not loaded")
            link = RdmaLinkObserved(action.name, "rxe", action.netdev)
            self.observed = replace(o, rdma_links=(*o.rdma_links, link))
        elif isinstance(action, DeleteRxe):
            link = o.rdma_link(action.name)
            if link is None:
                raise SimError(errno.ENODEV, action.name)
            if link.usage.busy:
                self.hurt.append(f"rxe {action.name}")
            self.observed = replace(
                o, rdma_links=tuple(r for r in o.rdma_links if r.name != action.name)
            )
        else:
            raise AssertionError(f"unknown action {action!r}")

    def _replace_pf(self, pci: str, change: object) -> None:
        assert callable(change)
        pfs = []
        found = False
        for pf in self.observed.pfs:
            if pf.pci == pci:
                pf = change(pf)
                found = True
            pfs.append(pf)
        if not found:
            raise SimError(errno.ENODEV, pci)
        self.observed = replace(self.observed, pfs=tuple(pfs))

    def _numvfs(self, pf: PfObserved, action: SetNumVfs) -> PfObserved:
        if pf.driver == "bnxt_en" and pf.operstate_up is False and action.new:
            raise SimError(errno.ENETDOWN, f"{pf.pci}: bnxt creates VFs only while up")
        if action.new > pf.totalvfs:
            raise SimError(errno.ERANGE, f"{action.new} > {pf.totalvfs}")
        if pf.numvfs != 0 and action.new != 0:
            raise SimError(errno.EBUSY, f"{pf.pci} has {pf.numvfs} VFs")
        self.hurt.extend(f"{pf.pci} VF {v.index}" for v in pf.vfs if v.vport_busy)
        return replace(pf, numvfs=action.new, vfs=make_vfs(pf, action.new))


def make_vfs(pf: PfObserved, count: int) -> tuple[VfObserved, ...]:
    """Fresh VFs as a driver creates them: default driver, zero settings."""
    bus, _, _ = pf.pci.rpartition(":")
    return tuple(
        VfObserved(
            index=i,
            pci=f"{bus}:{0x10 + i // 8:02x}.{i % 8}",
            driver="vfdrv",
            netdev=None,
            settings=VfSettings(
                mac="00:00:00:00:00:00",
                vlan=0,
                qos=0,
                vlan_proto="802.1Q",
                spoofchk=True,
                trust=False,
                link_state="auto",
                min_tx_rate=0,
                max_tx_rate=0,
                query_rss=False,
            ),
            ib=IbVfSettings(ZERO_GUID, ZERO_GUID, "Follow") if pf.ib_device else None,
        )
        for i in range(count)
    )


def _settings(pf: PfObserved, action: SetVfSettings) -> PfObserved:
    vfs = list(pf.vfs)
    for change in action.changes:
        vf = next(v for v in vfs if v.index == change.vf)
        assert vf.settings is not None
        new = replace(vf.settings, **{change.attr: change.new})
        vfs[vfs.index(vf)] = replace(vf, settings=new)
    return replace(pf, vfs=tuple(vfs))


def _ib(pf: PfObserved, action: SetIbVf, hurt: list[str]) -> PfObserved:
    vfs = list(pf.vfs)
    vf = next(v for v in vfs if v.index == action.vf)
    assert vf.ib is not None
    if action.rebind and vf.usage.busy:
        hurt.append(f"{vf.pci} rebound for new GUIDs")
    elif vf.usage.busy:
        # A policy "Down" takes the port of the VM using the VF down.
        hurt.append(f"{vf.pci} InfiniBand policy rewritten while in use")
    new = replace(vf.ib, **{c.attr: c.new for c in action.changes})
    vfs[vfs.index(vf)] = replace(vf, ib=new)
    return replace(pf, vfs=tuple(vfs))
