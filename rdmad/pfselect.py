"""Which PFs a ``[[sriov]]`` selector (``select = { vendor, device, driver, pci_path,
name }``) means: the one rule that the daemon (``rdmad.reconcile.resolve``, over what it
observed) and ``rdmad-ctl doctor`` (over the files it reads) both apply, so the doctor
never tells an operator a PF is matched when the daemon would not act on it.

Standard library only: the doctor runs where rdmad's own dependencies are broken.

* Each key given must match, any of its values. ``vendor`` and ``device`` are PCI IDs
  compared exactly, as sysfs prints them (4 lowercase hex digits: ``"0x15B3"`` is read
  ``"15b3"``); ``driver``, ``pci_path`` (the PCI address) and ``name`` (the netdev) are
  shell patterns (fnmatch, as udev and networkd's ``[Match]`` take them).
* A PF that lacks what a key asks about (no driver bound, no netdev, not a PCI function)
  does not match that key; ``could_match`` asks whether it may once it has them.
* A PF's netdev is its own one: not a switchdev representor, lowest ``dev_port`` first
  (mlx4 puts both ports on one function), then by name (``own_netdev``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import NamedTuple

KEYS = ("vendor", "device", "driver", "pci_path", "name")
ID_KEYS = ("vendor", "device")

# A PF's or a VF's representor on a switchdev PF (phys_port_name pfN, pfNvfM, pfNsfM,
# cCpfN...): a netdev under the PF's device that does not stand for the PF itself.
REPRESENTOR_PORT = re.compile(r"^(c\d+)?pf\d+((vf|sf)\d+)?$")

# One selector: each key given, its values (any of them matches), as rdmad reads them.
Selector = Mapping[str, Sequence[str]]


class Candidate(NamedTuple):
    """What a selector asks about one SR-IOV PF: its PCI address (a netdevsim device's
    name for those), PCI vendor and device ID (None: not a PCI function), bound driver
    and own netdev (None: none)."""

    pci: str
    vendor: str | None = None
    device: str | None = None
    driver: str | None = None
    name: str | None = None


def pci_id(value: str) -> str | None:
    """A PCI vendor or device ID as sysfs and ``lspci -n`` print it (4 lowercase hex
    digits); None when ``value`` is not one."""
    ident = value.strip().lower().removeprefix("0x")
    return ident if re.fullmatch(r"[0-9a-f]{4}", ident) else None


def read_value(key: str, value: str) -> str:
    """A selector value as rdmad compares it: an ID normalized (an invalid one kept as
    given, for validation to refuse), a pattern as written."""
    if key in ID_KEYS:
        return pci_id(value) or value.strip().lower().removeprefix("0x")
    return value


def identity(raw: Mapping[str, object]) -> str:
    """A ``select`` table as read from TOML, as a merge key: each key's values as rdmad
    reads them, sorted (``"15B3"`` is ``"15b3"``, one value is an array of one). Two
    files' selectors with one identity are one declaration."""
    parts = []
    for k in sorted(raw):
        value = raw[k]
        values = value if isinstance(value, list) else [value]
        parts.append(f"{k}={'|'.join(sorted(read_value(k, str(v)) for v in values))}")
    return ",".join(parts)


def matches(select: Selector, pf: Candidate) -> bool:
    """Whether ``pf`` matches each key ``select`` gives (any of that key's values)."""
    seen = _facts(pf)
    for key, values in select.items():
        value = seen[key]
        if value is None:
            return False
        if key in ID_KEYS:
            if value not in values:
                return False
        elif not any(fnmatchcase(value, p) for p in values):
            return False
    return True


def could_match(select: Selector, pf: Candidate) -> bool:
    """Whether ``pf`` matches each key ``select`` gives that it has an answer to now:
    what it lacks (no driver bound yet, so no netdev either) is not held against it. A
    PF that matches could match."""
    seen = _facts(pf)
    return matches({k: v for k, v in select.items() if seen[k] is not None}, pf)


def unbound(select: Selector, pfs: Iterable[Candidate]) -> list[str]:
    """The addresses of the PFs among ``pfs`` with no driver bound that ``select`` could
    match once one is (in ``pfs``'s order): what the daemon's note and the doctor name
    for a selector that matches none."""
    return [pf.pci for pf in pfs if pf.driver is None and could_match(select, pf)]


def unbound_words(pcis: Sequence[str]) -> str:
    """How the daemon's note and the doctor say ``unbound``'s PFs."""
    return (
        f"{', '.join(pcis)} has no driver bound and may match once one is: nothing to do until then"
    )


def pending_words(pcis: Sequence[str], unread: str | None = None) -> str:
    """How the daemon and the doctor say PFs with no driver that udev has not processed
    yet (at boot), before what may follow; ``unread``: the path under /run/udev whose
    lookup failed, which made that unknown (waited for as "not yet")."""
    if unread:
        return f"{', '.join(pcis)} has no driver bound, and {udev_unknown_words(unread)}"
    return f"{', '.join(pcis)} has no driver bound yet and udev has not processed it (at boot)"


def udev_unknown_words(unread: str) -> str:
    """How the daemon and the doctor say that a lookup of ``unread`` under /run/udev
    failed, so whether udev has processed a PF is unknown (waited for as "not yet")."""
    return f"whether udev has processed it is unknown ({unread} could not be read)"


def _facts(pf: Candidate) -> dict[str, str | None]:
    """What each key asks about ``pf``."""
    return {
        "vendor": pf.vendor,
        "device": pf.device,
        "driver": pf.driver,
        "pci_path": pf.pci,
        "name": pf.name,
    }


def given(select: Selector) -> list[tuple[str, Sequence[str]]]:
    """The keys given, in ``KEYS`` order (the order messages and names use)."""
    return [(k, select[k]) for k in KEYS if k in select]


def key(select: Selector) -> str:
    """'select:vendor=15b3,device=1017|1019': one word, for an object's name."""
    return "select:" + ",".join(f"{k}={'|'.join(v)}" for k, v in given(select))


def describe(select: Selector) -> str:
    """'vendor 15b3, device 1017 or 1019', for a message."""
    return ", ".join(f"{k.replace('_', ' ')} {' or '.join(v)}" for k, v in given(select))


def parse(raw: object) -> dict[str, tuple[str, ...]] | str:
    """A ``select`` table as read from TOML, as rdmad reads it; a string says why it is
    not one (the config's validation says the same at more length). For readers that do
    not validate the config (the doctor)."""
    if not isinstance(raw, dict) or not raw:
        return f"a selector needs at least one of {', '.join(KEYS)}"
    out: dict[str, tuple[str, ...]] = {}
    for k, value in raw.items():
        if k not in KEYS:
            return f"unknown key {k!r} (one of {', '.join(KEYS)})"
        values = [value] if isinstance(value, str) else value
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, str) for v in values)
        ):
            return f"{k}: expected a string or a non-empty array of strings"
        if k in ID_KEYS:
            ids = [pci_id(v) for v in values]
            if None in ids:
                return f"{k}: not a PCI ID (want 4 hex digits, e.g. '15b3'): {value!r}"
            values = ids
        out[k] = tuple(str(v) for v in values)
    return out


def own_netdev(netdevs: Iterable[tuple[str, str | None, int]]) -> str | None:
    """The netdev that stands for a function itself among (name, phys_port_name,
    dev_port) of those under its ``net/``: not a representor, lowest dev_port first,
    then by name so the choice is stable. None when there is none."""
    candidates = [
        (dev_port, name)
        for name, port_name, dev_port in netdevs
        if not (port_name and REPRESENTOR_PORT.match(port_name))
    ]
    return min(candidates)[1] if candidates else None
