"""The doctor's eSwitch check: each declared PF's (named, or matched by a selector)
eSwitch mode (and inline and encap modes) as devlink reports it, the declared one beside
it, and what keeps rdmad from setting it: a driver without an eSwitch (never settable),
or VFs that exist (a mode change re-creates them, so rdmad makes it only while none is
in use; the VFs and their drivers are listed, `rdmad-ctl status` names what holds them).

devlink is asked only about the host the doctor runs on: with ``--root`` (another
tree) the modes are not read and the check says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rdmad.doctor.declared import Declared
from rdmad.doctor.fs import Root
from rdmad.doctor.pfs import vfs
from rdmad.doctor.report import Check

OPTIONS = ("mode", "inline_mode", "encap_mode")


@dataclass(frozen=True, slots=True)
class Seen:
    """One PF's eSwitch as devlink answered: its modes when read (None: an option the
    driver does not report); else ``absent`` (devlink says there is none: no devlink
    instance, or the driver has no eSwitch) or ``unread`` (the question failed: no
    answer is not "none")."""

    mode: str | None = None
    inline_mode: str | None = None
    encap_mode: str | None = None
    absent: str = ""
    unread: str = ""


# PF (PCI address or netdevsim name) -> what devlink says; tests pass their own.
EswitchReader = Callable[[str], Seen]


def describe(seen: Seen) -> str:
    if seen.mode is None:
        return f"no eSwitch ({seen.absent})" if seen.absent else f"not read: {seen.unread}"
    parts = [f"{name.replace('_', '-')} {getattr(seen, name)}" for name in OPTIONS]
    return ", ".join(p for p in parts if not p.endswith(" None"))


def eswitch_check(fs: Root, declared: Declared, devlink: EswitchReader | None) -> Check | None:
    """None when no PF is declared here (the SR-IOV check says so). A PF a selector
    matched takes its selector's ``eswitch``."""
    pfs = declared.pfs
    managed = [pf for pf in pfs if isinstance(pf.entry.get("eswitch"), dict)]
    if not pfs:
        return None
    if devlink is None:
        if not managed:
            return None
        return Check(
            "eswitch",
            "unknown",
            f"{len(managed)} declared eSwitch mode(s) not read",
            ("devlink is asked only about this host, not about a --root tree",),
        )
    evidence: list[str] = []
    none: list[str] = []  # declared, but the PF has no eSwitch
    differs: list[str] = []
    unsupported: list[str] = []  # declared options the driver does not have
    unread: list[str] = []
    for pf in pfs:
        name, dev = pf.label, pf.dev
        wanted = {k: v for k, v in (pf.entry.get("eswitch") or {}).items() if k in OPTIONS}
        if dev is None:
            if wanted:
                unread.append(name)
                evidence.append(f"pf {name}: not present")
            continue
        seen = devlink(dev)
        line = f"pf {name} ({dev}): {describe(seen)}"
        if seen.mode is None:
            if wanted and seen.unread:
                unread.append(name)
            elif wanted:
                none.append(name)
            evidence.append(line + (f"; declared {_declared(wanted)}" if wanted else ""))
            continue
        # An option the driver does not report is one it does not have: not a difference
        # rdmad could mend (it reports the option unsupported-by-driver).
        lacking = [k for k in wanted if getattr(seen, k) is None]
        wrong = {k: v for k, v in wanted.items() if k not in lacking and getattr(seen, k) != v}
        evidence.append(line + (f"; declared {_declared(wrong)}" if wrong else ""))
        if lacking:
            unsupported.append(name)
            evidence += [
                f"  the driver reports no {k.replace('_', '-')}: rdmad reports the declared "
                f"{wanted[k]} unsupported-by-driver"
                for k in lacking
            ]
        if not wrong:
            continue
        differs.append(name)
        present = vfs(fs, dev) if "mode" in wrong else []
        if present:
            evidence.append(
                f"  {len(present)} VF(s) exist: a mode change re-creates them, so rdmad "
                "makes it only while none is in use"
            )
            evidence += [f"  vf {i} ({pci}): {drv or 'no driver'}" for i, pci, drv in present]
    if none:
        return Check(
            "eswitch",
            "fail",
            f"{len(none)} PF(s) with an eSwitch mode declared have no eSwitch",
            tuple(evidence),
            "the driver has no eSwitch (devlink): remove `eswitch` from these PFs, or use a "
            "driver that has one (mlx5_core, ice, ...)",
        )
    if unread:
        return Check(
            "eswitch", "unknown", f"{len(unread)} PF(s)' eSwitch not read", tuple(evidence)
        )
    if differs:
        return Check(
            "eswitch",
            "warn",
            f"{len(differs)} PF(s)' eSwitch not as declared",
            tuple(evidence),
            "rdmad sets it at its next pass, before the VFs (is it running?); under VFs "
            "in use it waits, and `rdmad-ctl status` names what holds them",
        )
    if unsupported:
        return Check(
            "eswitch",
            "warn",
            f"{len(unsupported)} PF(s) declare eSwitch options their driver does not have",
            tuple(evidence),
            "remove the options the driver lacks from `eswitch` (rdmad leaves them alone)",
        )
    if managed:
        return Check(
            "eswitch", "ok", f"{len(managed)} declared eSwitch mode(s) as declared", tuple(evidence)
        )
    return Check("eswitch", "info", "eSwitch not managed (no PF declares one)", tuple(evidence))


def _declared(values: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', '-')} {v}" for k, v in values.items())
