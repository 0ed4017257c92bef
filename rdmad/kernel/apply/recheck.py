"""The re-check right before a destructive write: does the kernel still show what the
write was planned from, and is what it destroys still free?

Plans are made from an observation; between it and the write a VM may open a VF's
vfio group, a verbs job may open an rxe device, someone may change numvfs. A write
that no longer matches is dropped (``StaleAction``) and the next pass plans again.
The host re-checks before an action's first write and again right before each
destructive write that follows other writes of the action (a driver change loads a
module for up to two minutes before it unbinds).

An eSwitch mode change or a numvfs change destroys the VFs' representors too: their
users (read from sysfs: phys_port_name pfNvfM) are re-checked with the VFs'.

A re-check that cannot look (a listing or read fails: ``Unreadable``) is stale too,
naming why: not being able to tell is never "free".
"""

from __future__ import annotations

from collections.abc import Sequence

from rdmad.kernel.apply.writes import Op, PlannedWrite
from rdmad.kernel.sysfs import PCI_DEVICES, Sysfs
from rdmad.kernel.sysfs_files import Unreadable
from rdmad.kernel.usage.holders import (
    rdma_link_usage_now,
    representor_usage_now,
    vf_usage_now,
)
from rdmad.model import RdmaLinkObserved


class StaleAction(Exception):
    """The kernel no longer matches what the action was planned from."""


def recheck(w: PlannedWrite, sysfs: Sysfs, links: Sequence[RdmaLinkObserved]) -> None:
    """Raise StaleAction unless ``w`` may still run; ``links`` are the RDMA links now."""
    try:
        _recheck(w, sysfs, links)
    except Unreadable as exc:
        raise StaleAction(f"whether it may still run is unknown: {exc.reason}") from None


def _recheck(w: PlannedWrite, sysfs: Sysfs, links: Sequence[RdmaLinkObserved]) -> None:
    _target, old, _new = w.changes[0]
    if w.op is Op.NUMVFS:
        text = sysfs.read_known(w.path)
        now = int(text) if text is not None and text.isdigit() else None
        if now != old:
            raise StaleAction(f"sriov_numvfs is {now}, planned from {old}")
        _vports_free(sysfs, w.path.rsplit("/", 2)[-2], links)
    elif w.op is Op.ESWITCH:
        _vports_free(sysfs, w.path, links)
    elif w.op is Op.UNBIND:
        pci = w.value
        now_driver = sysfs.link_known(f"{PCI_DEVICES}/{pci}/driver")
        if now_driver != old:
            raise StaleAction(f"{pci} is bound to {now_driver or 'no driver'}, not {old}")
        usage = vf_usage_now(sysfs, pci, links)
        if usage.busy:
            raise StaleAction(f"{pci} is now in use: {usage.describe()}")
    elif w.op is Op.RXE_DEL:
        link = next((lk for lk in links if lk.name == w.path), None)
        if link is None:
            raise StaleAction(f"RDMA link {w.path} is already gone")
        if old not in ("present", f"rxe on {link.netdev}"):
            raise StaleAction(f"{w.path} is now on {link.netdev}, planned as {old}")
        usage = rdma_link_usage_now(sysfs, link)
        if usage.busy:
            raise StaleAction(f"{w.path} is now in use: {usage.describe()}")


def _vports_free(sysfs: Sysfs, pf: str, links: Sequence[RdmaLinkObserved]) -> None:
    """Every VF of ``pf`` and every VF representor free now (both go with the vports)."""
    for index, vf_pci in sorted(sysfs.virtfns(pf).items()):
        usage = vf_usage_now(sysfs, vf_pci, links)
        if usage.busy:
            raise StaleAction(f"VF {index} ({vf_pci}) is now in use: {usage.describe()}")
    for index, netdev in sorted(sysfs.vf_representors(pf).items()):
        usage = representor_usage_now(sysfs, netdev, links)
        if usage.busy:
            raise StaleAction(f"VF {index}'s representor is now in use: {usage.describe()}")
