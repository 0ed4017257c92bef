"""Other managers that declare SR-IOV for a PF: systemd (.link files, applied by
systemd-udevd; .network files, by systemd-networkd), NetworkManager (profiles with
[sriov]) and the SR-IOV network operator's config daemon. Two managers writing one PF's
VF count fight: each undoes the other at its next event. So rdmad holds its writes for
a PF another manager declares, unless its [[sriov]] says ``owner = "rdmad"``.

Pure and standard-library only: ``find()`` reads through the ``Files`` it is given (the
daemon's ``Sysfs``, the doctor's read-only root), so the daemon, ``rdmad-ctl doctor`` and
the tests' fake trees use one code. A match rule rdmad cannot evaluate, or a file it
cannot parse that mentions SR-IOV, may apply: it is a claim (``certain`` False, with why).
A directory or file that cannot be read makes the answer unknown for every PF, never
"nothing there".

The daemon reads these files at each full observation (a reload, the drift check, a
PF's device or driver event): they are a handful of small files, and no event says one
changed, so a file written by hand is seen at the next reload or drift check.

  facts.py     PfFacts, Claim, PfManagers, the Files protocol, match verdicts
  ini.py       the ini-style syntax both systemd and NetworkManager use
  networkd.py  .link/.network: search path, masking, drop-ins, [Match], first match wins
  nm.py        NetworkManager keyfiles: [sriov] and what device a profile is for
  operator.py  the operator config daemon's files: stored PF state, systemd mode's list
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from rdmad.managers import networkd, nm
from rdmad.managers.facts import CannotRead, Claim, Files, PfFacts, PfManagers
from rdmad.managers.operator import OperatorTrace

T = TypeVar("T")


def find(files: Files, pfs: Iterable[PfFacts]) -> dict[str, PfManagers]:
    """Per PF (by PCI address): what the other managers declare for it."""
    unknown: list[str] = []

    def attempt(load: Callable[[Files], T]) -> T | None:
        try:
            return load(files)
        except CannotRead as exc:
            unknown.append(exc.reason)
            return None

    netfiles = attempt(networkd.load)
    profiles = attempt(nm.load)
    trace = attempt(OperatorTrace)
    out = {}
    for pf in pfs:
        claims: list[Claim] = []
        if netfiles is not None:
            claims += networkd.claims(netfiles, pf)
        if profiles is not None:
            claims += nm.claims(profiles, pf)
        if trace is not None:
            claims += trace.claims(pf)
        out[pf.pci] = PfManagers(tuple(claims), tuple(unknown))
    return out


__all__ = ["CannotRead", "Claim", "Files", "PfFacts", "PfManagers", "find"]
