"""Which other network managers declare SR-IOV for each PF (``rdmad.managers`` decides
from their files; this reads those files and the PF's netdev facts under the root).

Read at each full observation: the fast event path carries the last answer over."""

from __future__ import annotations

import errno
from collections.abc import Sequence

from msgspec import structs

from rdmad import udevdb
from rdmad.kernel.sysfs import CLASS_NET, Sysfs
from rdmad.kernel.sysfs_files import Unreadable
from rdmad.managers import CannotRead, PfFacts, find
from rdmad.model.observed import PfObserved

# ARPHRD_* of /sys/class/net/NAME/type as systemd's Type= names them.
_TYPES = {"1": "ether", "32": "infiniband"}
# name_assign_type: 1 the kernel's enumeration, 2 predictable by the kernel; the name is
# still the kernel's own. 3 (set by user space) and 4 (renamed): the original is unknown.
_KERNEL_NAMED = frozenset({"1", "2"})


class _Files:
    """``rdmad.managers.Files`` over Sysfs: absent is "nothing", any other failure is
    CannotRead (never "nothing there")."""

    def __init__(self, sysfs: Sysfs) -> None:
        self.sysfs = sysfs

    def names(self, rel: str) -> list[str]:
        try:
            return self.sysfs.entries(rel, optional=True)
        except Unreadable as exc:
            raise CannotRead(exc.reason) from None

    def text(self, rel: str) -> str | None:
        try:
            return self.sysfs.read_known(rel)
        except Unreadable as exc:
            if exc.errno in (errno.EISDIR, errno.EINVAL):  # not a file to read
                return None
            raise CannotRead(exc.reason) from None

    def link_name(self, rel: str) -> str | None:
        return self.sysfs.link_name(rel)


def pf_facts(sysfs: Sysfs, pf: PfObserved) -> PfFacts:
    name = pf.netdev
    if name is None:
        return PfFacts(pf.pci, driver=pf.driver, mac=pf.mac, perm_mac=pf.perm_mac)
    base = f"{CLASS_NET}/{name}"
    udev = None
    if pf.ifindex is not None:
        db = sysfs.read(udevdb.netdev_entry(pf.ifindex))
        if db is not None:
            udev = dict(
                line[2:].partition("=")[::2] for line in db.splitlines() if line.startswith("E:")
            )
    assign = sysfs.read(f"{base}/name_assign_type")
    return PfFacts(
        pf.pci,
        name=name,
        original_name=name if assign in _KERNEL_NAMED else None,
        mac=pf.mac,
        perm_mac=pf.perm_mac,
        driver=pf.driver,
        link_type=_TYPES.get(sysfs.read(f"{base}/type") or ""),
        udev=udev,
    )


def with_managers(sysfs: Sysfs, pfs: Sequence[PfObserved]) -> tuple[PfObserved, ...]:
    """The PFs, each with what other managers declare for it."""
    found = find(_Files(sysfs), [pf_facts(sysfs, pf) for pf in pfs])
    return tuple(structs.replace(pf, managers=found[pf.pci]) for pf in pfs)
