"""The values every reader here works with: what a PF looks like to other network
managers' match rules (``PfFacts``), what one of them declares for it (``Claim``), and the
answer per PF (``PfManagers``); the ``Files`` a reader reads through; the verdict of one
match rule (``Match``)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


class CannotRead(Exception):
    """A directory or file that exists could not be read: what it declares is unknown."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Files(Protocol):
    """Read-only files relative to a root (the daemon's ``Sysfs``, the doctor's root).

    ``names``: a directory's entries, [] when it is not there; ``text``: a file's text,
    None when it is not there; ``link_name``: the last part of a symlink's target, None
    when it is no symlink. Any other failure raises ``CannotRead`` naming the path."""

    def names(self, rel: str) -> list[str]: ...

    def text(self, rel: str) -> str | None: ...

    def link_name(self, rel: str) -> str | None: ...


class Match(enum.Enum):
    YES = "yes"
    NO = "no"
    MAYBE = "maybe"  # cannot be told from what rdmad reads: counts as a match


class Verdict(NamedTuple):
    match: Match
    why: str = ""  # for MAYBE: what could not be evaluated


def both(a: Verdict, b: Verdict) -> Verdict:
    """Two conditions that must both hold: NO wins, then MAYBE (reasons joined)."""
    if Match.NO in (a.match, b.match):
        return Verdict(Match.NO)
    if a.match is Match.MAYBE and b.match is Match.MAYBE:
        return Verdict(Match.MAYBE, f"{a.why}; {b.why}")
    return a if a.match is Match.MAYBE else b


YES = Verdict(Match.YES)
NO = Verdict(Match.NO)


class PfFacts(NamedTuple):
    """A PF as match rules see it. None: not known (no netdev, not read): a rule on it
    may match. ``udev``: the netdev's udev properties (ID_PATH, ID_NET_DRIVER,
    ID_NET_NAME_*...), None without a udev database entry."""

    pci: str
    name: str | None = None
    original_name: str | None = None  # the kernel's name before udev renamed it
    mac: str | None = None
    perm_mac: str | None = None
    driver: str | None = None
    link_type: str | None = None  # "ether", "infiniband" (systemd's Type=)
    udev: Mapping[str, str] | None = None

    @property
    def path(self) -> str:
        """udev's ID_PATH (what systemd's Path= and NetworkManager's match.path test);
        without a udev entry, what path_id gives a PCI function on a host bridge."""
        if self.udev is not None and self.udev.get("ID_PATH"):
            return self.udev["ID_PATH"]
        return f"pci-{self.pci}"

    def names(self) -> tuple[str, ...]:
        """The netdev's name and the alternative names udev gives it (systemd's Name=
        tests them all)."""
        out = [self.name] if self.name else []
        for key in ("ID_NET_NAME_ONBOARD", "ID_NET_NAME_SLOT", "ID_NET_NAME_PATH"):
            value = (self.udev or {}).get(key)
            if value and value not in out:
                out.append(value)
        return tuple(out)


class Claim(NamedTuple):
    """Another manager declares SR-IOV (a VF count or VF settings) for a PF.

    ``manager``: "systemd-udevd" (a .link file), "systemd-networkd" (a .network file),
    "NetworkManager" (a connection profile), "sriov-network-operator" (its config daemon's
    files). ``file``: where, absolute. ``what``: the declaration, in its own words.
    ``certain``: False when the file may apply to the PF but rdmad cannot tell (``why``)."""

    manager: str
    file: str
    what: str
    certain: bool = True
    why: str = ""

    def describe(self) -> str:
        where = f"{self.manager} declares SR-IOV for this PF in {self.file} ({self.what})"
        if self.certain:
            return where
        return (
            f"{self.manager} may declare SR-IOV for this PF in {self.file} ({self.what}; "
            f"whether it applies here is unknown: {self.why})"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "manager": self.manager,
            "file": self.file,
            "what": self.what,
            "certain": self.certain,
            "why": self.why,
        }


@dataclass(frozen=True, slots=True)
class PfManagers:
    """What other managers declare for one PF: the claims, and the reads that failed
    (``unknown``: a failed read is never "nothing there", so the PF is held)."""

    claims: tuple[Claim, ...] = ()
    unknown: tuple[str, ...] = field(default=())

    @property
    def contested(self) -> bool:
        return bool(self.claims or self.unknown)

    def describe(self) -> str:
        parts = [c.describe() for c in self.claims]
        if self.unknown:
            parts.append(
                "whether another manager declares SR-IOV for it is unknown: "
                + "; ".join(self.unknown)
            )
        return "; ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {"claims": [c.to_json() for c in self.claims], "unknown": list(self.unknown)}
