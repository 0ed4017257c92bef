"""udevd's database under /run/udev, as rdmad asks it: has udevd processed a device yet?

At boot the kernel announces each PCI device and netdev before udevd has run its rules
for it (coldplug's trigger): until then a PF may have no driver (the module its modalias
names is loaded by those rules) and a netdev may not have its final name. udevd writes a
database entry for each device it has processed; while it runs (its control socket
exists) a missing entry means "not yet", not "never". The daemon's observation and the
doctor both ask, so the paths and the rule live here, standard library only. Paths are
relative to the root the caller reads from (``/`` on a node, a fake tree in tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

CONTROL = "run/udev/control"  # udevd's control socket: it runs
DATA = "run/udev/data"


def pci_entry(pci: str) -> str:
    """The database entry of a PCI device (``+pci:0000:01:00.0``)."""
    return f"{DATA}/+pci:{pci}"


def netdev_entry(ifindex: int | str) -> str:
    """The database entry of a netdev, by its ifindex (``n3``)."""
    return f"{DATA}/n{ifindex}"


def unprocessed(lookup: Callable[[str], bool | None], entry: str) -> bool:
    """udevd runs and has not processed the device whose entry this is (yet). Without
    udevd nothing will process it: False, nothing to wait for.

    ``lookup`` says whether a path exists, None when that is unknown (the lookup failed
    with other than ENOENT). Unknown is read as the case that waits, udevd running and
    the entry missing: acting early can set a PF up before udev has named it, which
    then keeps the kernel's name; waiting costs a pass that says why."""
    return lookup(CONTROL) is not False and lookup(entry) is not True


class Verdict(NamedTuple):
    """``unprocessed``'s answer, with the path whose failed lookup made it "not yet"
    (``/run/udev/...``; None when every lookup answered): the words then say unknown."""

    pending: bool
    unread: str | None


def verdict(lookup: Callable[[str], bool | None], entry: str) -> Verdict:
    """``unprocessed(lookup, entry)``, and which lookup failed if one made it so."""
    failed: list[str] = []

    def noting(rel: str) -> bool | None:
        got = lookup(rel)
        if got is None:
            failed.append(rel)
        return got

    pending = unprocessed(noting, entry)
    return Verdict(pending, f"/{failed[0]}" if pending and failed else None)
