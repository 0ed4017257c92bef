"""The PFs the config declares, as the daemon would find them on the host the doctor
reads: each literal ``pf = {...}`` resolved to its device, and each ``select = {...}``
resolved against the SR-IOV PFs present (``rdmad.pfselect``, the daemon's own rule), with
the daemon's precedence (``rdmad.reconcile.resolve``): a literal ``pf`` wins over a
selector for the PF it names; a PF two selectors match is applied by neither; a selector
with no PF of its own here has nothing to do (converged, not a failure).

The SR-IOV PFs present are those the daemon observes: PCI functions with
``sriov_totalvfs``, then netdevsim devices with ``sriov_numvfs`` (the lab's test PFs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rdmad import pfselect, udevdb
from rdmad.doctor.fs import Root
from rdmad.doctor.pfs import (
    NSIM_DEVICES,
    PCI_DEVICES,
    device_dir,
    is_netdevsim,
    label,
    own_netdev,
    resolve_pf,
)


@dataclass(frozen=True, slots=True)
class DeclaredPf:
    """One PF a ``[[sriov]]`` applies to: its table (``numvfs``, ``owner``, ``eswitch``...),
    how messages name the declaration (``pci=...``, or ``select:vendor=8086,...``), the
    device found (PCI address or netdevsim name; None: not present) and, for a PF a
    selector matched, that selector."""

    entry: dict[str, Any]
    label: str
    dev: str | None
    select: str | None = None


@dataclass(frozen=True, slots=True)
class Declared:
    """``pfs``: the PFs the config applies to here. ``idle``: a line per selector with no
    PF of its own here (nothing to do). ``refused``: a line per selector the daemon
    would not read, and per PF several selectors match (applied by none)."""

    entries: int = 0  # [[sriov]] tables, literal and selector
    pfs: tuple[DeclaredPf, ...] = ()
    idle: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()


def candidates(fs: Root) -> list[pfselect.Candidate]:
    """The SR-IOV PFs present, with what a selector asks about each."""
    pcis = [p for p in fs.listdir(PCI_DEVICES) if fs.exists(f"{PCI_DEVICES}/{p}/sriov_totalvfs")]
    nsim = [
        d
        for d in fs.listdir(NSIM_DEVICES)
        if is_netdevsim(d) and fs.exists(f"{NSIM_DEVICES}/{d}/sriov_numvfs")
    ]
    out = []
    for dev in pcis + nsim:
        base = device_dir(dev)
        ids = (
            [None, None]
            if is_netdevsim(dev)
            else [fs.read(f"{base}/{k}") for k in pfselect.ID_KEYS]
        )
        name = own_netdev(fs, fs.listdir(f"{base}/net"))
        vendor, device = (pfselect.pci_id(i) if i is not None else None for i in ids)
        out.append(pfselect.Candidate(dev, vendor, device, fs.link_name(f"{base}/driver"), name))
    return out


def declared_pfs(fs: Root, cfg: dict[str, Any]) -> Declared:
    entries = [e for e in cfg.get("sriov", []) if isinstance(e, dict)]
    if not entries:
        return Declared()
    literal: dict[str, dict[str, Any]] = {}  # device -> the literal [[sriov]] naming it
    found: list[tuple[dict[str, Any], str | None]] = []
    for entry in entries:
        if isinstance(entry.get("pf"), dict):
            dev = resolve_pf(fs, entry["pf"])
            found.append((entry, dev))
            if dev is not None:
                literal.setdefault(dev, entry)
    selectors: list[tuple[dict[str, Any], dict[str, tuple[str, ...]]]] = []
    refused: list[str] = []
    for entry in entries:
        if "pf" in entry:
            continue
        select = pfselect.parse(entry.get("select"))
        if isinstance(select, str):
            refused.append(f"{_as_toml(entry.get('select'))}: not a selector rdmad reads: {select}")
        else:
            selectors.append((entry, select))
    present = candidates(fs) if selectors else []
    claims: dict[str, list[str]] = {}  # device -> the selectors (keys) that match it
    for _, select in selectors:
        for pf in present:
            if pf.pci not in literal and pfselect.matches(select, pf):
                claims.setdefault(pf.pci, []).append(pfselect.key(select))
    pfs = [DeclaredPf(entry, label(entry["pf"]), dev) for entry, dev in found]
    idle: list[str] = []
    for entry, select in selectors:
        name = pfselect.key(select)
        hits = [pf.pci for pf in present if pfselect.matches(select, pf)]
        mine = [dev for dev in hits if claims.get(dev) == [name]]
        pfs += [DeclaredPf(entry, name, dev, name) for dev in mine]
        if mine:
            continue
        driverless = pfselect.unbound(select, [pf for pf in present if pf.pci not in literal])
        verdicts = {pci: udev_pending(fs, pci) for pci in driverless}
        later = [pci for pci in driverless if verdicts[pci].pending]
        unbound = [pci for pci in driverless if pci not in later]
        unread = next((verdicts[pci].unread for pci in later if verdicts[pci].unread), None)
        if not hits and later:
            idle.append(
                f"{name}: matches no PF here yet ({pfselect.describe(select)}); "
                f"{pfselect.pending_words(later, unread)}: it may match once its driver is bound "
                "(rdmad waits for it)" + (f"; {pfselect.unbound_words(unbound)}" if unbound else "")
            )
        elif not hits and unbound:
            idle.append(
                f"{name}: matches no PF here now ({pfselect.describe(select)}); "
                f"{pfselect.unbound_words(unbound)}"
            )
        elif not hits:
            idle.append(f"{name}: matches no PF here ({pfselect.describe(select)}): nothing to do")
        elif taken := [dev for dev in hits if dev in literal]:
            idle.append(
                f"{name}: the PFs it matches are declared by a literal pf, which wins over a "
                f"selector: {', '.join(taken)}"
            )
    for dev, rivals in claims.items():
        if len(rivals) > 1:
            refused.append(
                f"pf {dev}: matched by {len(rivals)} selectors ({' and '.join(rivals)}): rdmad "
                f'applies none; narrow them, or name it with pf = {{ pci = "{dev}" }}'
            )
    return Declared(len(entries), tuple(pfs), tuple(idle), tuple(refused))


def _as_toml(raw: object) -> str:
    """``select = { vendor = "intel" }``: the table as the operator wrote it."""
    if not isinstance(raw, dict):
        return f"select = {json.dumps(raw)}"
    return "select = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in raw.items()) + " }"


def udev_pending(fs: Root, pci: str) -> udevdb.Verdict:
    """A PCI PF with no driver that udevd has not processed yet (at boot: coldplug may
    still load its driver), as the daemon's observation judges it: a failed lookup is
    unknown, which waits (its path in ``unread``)."""
    if is_netdevsim(pci):
        return udevdb.Verdict(False, None)
    return udevdb.verdict(fs.lookup, udevdb.pci_entry(pci))
