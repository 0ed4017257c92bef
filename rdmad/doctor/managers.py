"""Whether another network manager declares SR-IOV for a declared PF (``rdmad.managers``
decides, the daemon with the same code): rdmad then holds its writes to that PF unless
its [[sriov]] says ``owner = "rdmad"`` (a PF a selector matched: that selector's
[[sriov]]). No PF declared (or none present): no check."""

from __future__ import annotations

import errno
import os

from rdmad import udevdb
from rdmad.doctor.declared import Declared
from rdmad.doctor.fs import Root
from rdmad.doctor.pfs import PCI_DEVICES, is_netdevsim, own_netdev
from rdmad.doctor.report import Check
from rdmad.managers import CannotRead, PfFacts, find

_ABSENT = (errno.ENOENT, errno.ENOTDIR)
_TYPES = {"1": "ether", "32": "infiniband"}


class _Files:
    """``rdmad.managers.Files`` over the doctor's root: absent is "nothing", refused is
    CannotRead (the root's reads fold the two together)."""

    def __init__(self, fs: Root) -> None:
        self.fs = fs

    def _fail(self, verb: str, rel: str, exc: OSError) -> CannotRead:
        return CannotRead(f"cannot {verb} /{rel}: {exc.strerror or exc}")

    def names(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.fs.path(rel)))
        except OSError as exc:
            if exc.errno in _ABSENT:
                return []
            raise self._fail("list", rel, exc) from None

    def text(self, rel: str) -> str | None:
        try:
            with open(self.fs.path(rel), errors="replace") as fh:
                return fh.read().strip()
        except OSError as exc:
            if exc.errno in (*_ABSENT, errno.EISDIR):
                return None
            raise self._fail("read", rel, exc) from None

    def link_name(self, rel: str) -> str | None:
        return self.fs.link_name(rel)


def pf_facts(fs: Root, pci: str) -> PfFacts:
    driver = fs.link_name(f"{PCI_DEVICES}/{pci}/driver")
    name = own_netdev(fs, fs.listdir(f"{PCI_DEVICES}/{pci}/net"))
    if name is None:
        return PfFacts(pci, driver=driver)
    base = f"sys/class/net/{name}"
    db = fs.read(udevdb.netdev_entry(fs.read(f"{base}/ifindex") or ""))
    udev = None
    if db is not None:
        udev = dict(ln[2:].partition("=")[::2] for ln in db.splitlines() if ln.startswith("E:"))
    return PfFacts(
        pci,
        name=name,
        original_name=name if fs.read(f"{base}/name_assign_type") in ("1", "2") else None,
        mac=fs.read(f"{base}/address"),
        driver=driver,
        link_type=_TYPES.get(fs.read(f"{base}/type") or ""),
        udev=udev,
    )


def managers_check(fs: Root, declared: Declared) -> Check | None:
    """A PF a selector matched follows its selector's ``owner``."""
    pfs = [pf for pf in declared.pfs if pf.dev is not None and not is_netdevsim(pf.dev)]
    if not pfs:
        return None
    devs = sorted({pf.dev for pf in pfs if pf.dev is not None})
    found = find(_Files(fs), [pf_facts(fs, dev) for dev in devs])
    evidence, held, taken, unknown = [], [], [], []
    for pf in pfs:
        assert pf.dev is not None
        seen = found[pf.dev]
        if not seen.contested:
            continue
        name = f"pf {pf.label} ({pf.dev})"
        evidence.append(f"{name}: {seen.describe()}")
        if pf.entry.get("owner") == "rdmad":
            taken.append(name)
        elif seen.claims:
            held.append(name)
        else:
            unknown.append(name)
    if not evidence:
        return Check(
            "other-managers",
            "ok",
            f"no other network manager declares SR-IOV for the {len(pfs)} declared PF(s)",
        )
    if held or unknown:
        what = f"{len(held) + len(unknown)} declared PF(s) held: rdmad writes nothing to them"
        return Check(
            "other-managers",
            "unknown" if unknown and not held else "warn",
            what,
            tuple(evidence),
            "leave the PF to the other manager (remove its [[sriov]]), remove the other "
            'manager\'s SR-IOV declaration, or set owner = "rdmad" in its [[sriov]]'
            + (" (run as root to read every file)" if unknown else ""),
        )
    return Check(
        "other-managers",
        "warn",
        f'{len(taken)} declared PF(s) taken over (owner = "rdmad") from another manager',
        tuple(evidence),
        "stop the other manager from writing them (remove its SR-IOV declaration), or "
        "the two undo each other's changes",
    )
