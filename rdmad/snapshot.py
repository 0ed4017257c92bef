"""The node's live SR-IOV and rxe state, written in rdmad's config format.

"Make what I set by hand persistent" is then one command: `rdmad snapshot -o
/etc/rdmad/rdmad.d/50-snapshot.toml`. The output is a declaration that plans
nothing on the node it came from (tested as a round trip), and it says what it
leaves out: a setting the PF driver cannot set, a value the kernel reports as
unset or that is not a declarable value, VF settings that could not be read.
Those are comments, never silently dropped and never declared as if settable.

Written by hand rather than with a TOML library: the values are MACs, GUIDs,
names, integers and booleans, and the file is meant to be read by people, so
it carries a header, comments beside the values, and the example config's key order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from rdmad.model import NO_DRIVER, Observed, PfObserved, VfObserved, VfSettings, VfSpec
from rdmad.model.validation import SpecError, validate
from rdmad.text import safe
from rdmad.tomlcompat import tomllib

_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
ZERO_MAC = "00:00:00:00:00:00"
ZERO_GUID = "00:00:00:00:00:00:00:00"
# Drivers that mean "chosen by someone": a VF on its default driver needs no key.
EXPLICIT_DRIVERS = frozenset({"vfio-pci", "pci-stub"})
_SETTING_KEYS = (
    "mac", "vlan", "qos", "vlan_proto", "spoofchk", "trust", "link_state",
    "min_tx_rate", "max_tx_rate", "query_rss",
)  # fmt: skip
ANY = None  # in UNSETTABLE: every value of the attribute

# VF attributes a PF driver cannot set: written as comments, so the snapshot does not
# declare what rdmad could never restore. Per driver: attribute -> (values refused,
# or ANY; why, as the comment says it). Sources: Linux 6.1
# drivers/net/ethernet/intel/igb/igb_main.c (no ndo_set_vf_link_state and no
# ndo_set_vf_rss_query_en; igb_ndo_set_vf_vlan refuses all but 802.1Q;
# igb_ndo_set_vf_bw takes no minimum rate and a maximum only on an 82576 with link
# up) and the lab's measurements on QEMU's igb (EOPNOTSUPP for link-state and
# query_rss, EPROTONOSUPPORT for 802.1ad, EINVAL for both rates).
UNSETTABLE: dict[str, dict[str, tuple[frozenset[object] | None, str]]] = {
    "igb": {
        "link_state": (ANY, "igb cannot set it"),
        "query_rss": (ANY, "igb cannot set it"),
        "vlan_proto": (frozenset({"802.1ad"}), "igb sets only 802.1Q"),
        "min_tx_rate": (ANY, "igb has no minimum rate"),
        "max_tx_rate": (
            ANY,
            "igb sets it only on an 82576 with link up; uncomment if this NIC does",
        ),
    },
}


def settings_unknown(observed: Observed) -> list[str]:
    """PFs with VFs whose settings could not be read (so the snapshot declares none)."""
    return [pf.pci for pf in observed.pfs if pf.numvfs and pf.settings_note]


def header_for(observed: Observed, where: str) -> str:
    """The snapshot's opening comment: where it was taken and what it could not read."""
    text = f"Written by `rdmad snapshot` from {where}: the live state, declared."
    for note in observed.notes:
        text += f"\nnote: {note}"
    unknown = settings_unknown(observed)
    if unknown:
        text += "\nVF settings not read (so not declared) for: " + ", ".join(unknown)
    return text


def snapshot_doc(observed: Observed, where: str) -> dict[str, Any]:
    """docs/API.md's snapshot document but its "api": ``GET /v1/snapshot`` and `rdmad
    snapshot --json` print this one (``where``: "this host" or the tree observed)."""
    text = snapshot(observed, header=header_for(observed, where))
    return {
        "toml": text,
        "config": tomllib.loads(text),
        "notes": list(observed.notes),
        "settings_unknown": settings_unknown(observed),
    }


def snapshot(observed: Observed, header: str = "") -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for pf in observed.pfs:
        if pf.numvfs > 0:
            lines.extend(_sriov(pf))
    for link in observed.rdma_links:
        if link.is_rxe and link.netdev:
            lines += ["", "[[rxe]]", f"name = {_str(link.name)}"]
            lines.append(f"netdev = {{ name = {_str(link.netdev)} }}")
        elif link.is_rxe:
            lines += ["", f"# rxe link {link.name} has no netdev now, so it is not declared"]
    lines.extend(_rdma(observed))
    # Comments quote names and notes as the kernel gives them; a control character there
    # would drive a terminal and is not allowed in TOML. Values are JSON-escaped already.
    return "\n".join(safe(line) for line in lines).lstrip("\n") + "\n"


def _rdma(observed: Observed) -> list[str]:
    """The RDMA netns mode when it is not the kernel's default (shared): exclusive was
    chosen by someone, and is lost at the next boot unless declared."""
    mode = observed.rdma_sys.netns_mode if observed.rdma_sys is not None else None
    if mode == "exclusive":
        return ["", "[rdma]", 'netns_mode = "exclusive"']
    return []


def _sriov(pf: PfObserved) -> list[str]:
    if _PCI.match(pf.pci) or not pf.netdev:
        lines = ["", "[[sriov]]", f"pf = {{ pci = {_str(pf.pci)} }}"]
    else:  # not a PCI function (netdevsim): its netdev name is what a config can match
        lines = ["", "[[sriov]]", f"pf = {{ name = {_str(pf.netdev)} }}  # {pf.pci}"]
    if pf.netdev and _PCI.match(pf.pci):
        lines[-1] += f"  # {pf.netdev}, driver {pf.driver or 'none'}"
    lines.append(f"numvfs = {pf.numvfs}")
    if pf.drivers_autoprobe is False:
        lines.append("autoprobe = false")
    if pf.eswitch is not None and pf.eswitch.mode == "switchdev":
        # Drivers come back in legacy at every boot and reload. The mode only: its inline
        # and encap modes as read may be the driver's defaults, which some drivers
        # report but do not let be set.
        lines.append('eswitch = { mode = "switchdev" }')
    lines.extend(_unknown_vfs(pf))
    shared = _shared_macs(pf)
    for vf in pf.vfs:
        body = list(_vf(pf, vf, shared.get(vf.index)))
        if body:
            lines += ["", "[[sriov.vf]]", f"index = {vf.index}", *body]
    return lines


def _unknown_vfs(pf: PfObserved) -> Iterator[str]:
    """Comments for VFs whose settings (or whole device) could not be seen."""
    seen = {v.index for v in pf.vfs}
    missing = [i for i in range(pf.numvfs) if i not in seen]
    if missing:
        yield f"# VF {_ranges(missing)}: not visible, so nothing of them is declared"
    unread = [v.index for v in pf.vfs if v.settings is None]
    if unread:
        why = pf.settings_note or "the kernel did not report them"
        yield f"# VF {_ranges(unread)}: settings unknown ({why}), so not declared"


def _shared_macs(pf: PfObserved) -> dict[int, int]:
    """VF index -> the first VF of this PF with the same MAC (the config declares a MAC
    for one VF of a PF only; the later ones are written as comments)."""
    first: dict[str, int] = {}
    shared = {}
    for vf in pf.vfs:
        mac = vf.settings.mac if vf.settings is not None else None
        if mac and mac != ZERO_MAC:
            shared_with = first.setdefault(mac.lower(), vf.index)
            if shared_with != vf.index:
                shared[vf.index] = shared_with
    return shared


def _vf(pf: PfObserved, vf: VfObserved, mac_of: int | None = None) -> Iterable[str]:
    if vf.settings is not None:
        yield from _settings(pf.driver or "", vf.settings, mac_of)
    yield from _driver(pf, vf)
    if vf.ib is not None:
        for key in ("node_guid", "port_guid"):
            value = getattr(vf.ib, key)
            if value and value != ZERO_GUID:
                yield f"{key} = {_str(value)}"
        if vf.ib.policy:
            yield f"policy = {_str(vf.ib.policy)}"


def _driver(pf: PfObserved, vf: VfObserved) -> Iterator[str]:
    if vf.pci is None or not _PCI.match(vf.pci):
        return  # not a PCI device yet (or a netdevsim VF): nothing to bind
    if vf.driver is None:
        override = vf.driver_override
        if override and override != NO_DRIVER:
            yield f"driver = {_str(override)}  # driver_override set, not bound yet"
        else:
            yield f"driver = {_str(NO_DRIVER)}  # unbound: rdmad keeps it so (driver_override)"
    elif vf.driver in EXPLICIT_DRIVERS or vf.driver == vf.driver_override:
        yield f"driver = {_str(vf.driver)}"
    elif pf.drivers_autoprobe is False:
        # Without autoprobe a new VF stays unbound: its driver must be declared to come back.
        yield f"driver = {_str(vf.driver)}  # {pf.pci} has sriov_drivers_autoprobe = 0"


def _settings(pf_driver: str, s: VfSettings, mac_of: int | None = None) -> Iterator[str]:
    refused = UNSETTABLE.get(pf_driver, {})
    unreported = []
    for key in _SETTING_KEYS:
        value = getattr(s, key)
        if key == "mac" and value == ZERO_MAC:
            continue  # the "no MAC assigned" marker: nothing to restore
        if key == "mac" and mac_of is not None:
            yield f"# mac = {_value(value)}  (VF {mac_of}'s too: declared for one VF of a PF)"
            continue
        if key in ("qos", "vlan_proto") and not s.vlan:
            continue  # meaningless without a VLAN; the config requires vlan with them
        if value is None:
            unreported.append(key)
            continue
        if key in refused:
            values, why = refused[key]
            if values is ANY or value in values:
                yield f"# {key} = {_value(value)}  ({why})"
                continue
        if key == "vlan_proto" and value not in ("802.1Q", "802.1ad"):
            # The planner reads a vlan declared without a protocol as 802.1Q.
            yield f"# vlan_proto reads as {_value(value)} (unknown); vlan alone means 802.1Q"
            continue
        problem = _undeclarable(key, value, s)
        if problem:
            yield f"# {key} reads as {_value(value)}: {problem}; left out"
            continue
        yield f"{key} = {_value(value)}"
    if unreported:
        names = ", ".join(unreported)
        yield f"# not reported by the driver (reads as unset), so not declared: {names}"


def _undeclarable(key: str, value: object, s: VfSettings) -> str:
    """Why the config would refuse ``key = value`` ("" when it accepts it)."""
    if key == "min_tx_rate" and s.max_tx_rate and isinstance(value, int) and value > s.max_tx_rate:
        return f"above max_tx_rate {s.max_tx_rate}"
    fields: dict[str, object] = {"index": 0, key: value}
    if key in ("qos", "vlan_proto"):
        fields["vlan"] = s.vlan
    try:
        validate(VfSpec, fields)
    except SpecError as exc:
        return exc.problems[0][1]
    return ""


def _ranges(indexes: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out: list[str] = []
    start = prev = indexes[0]
    for i in [*indexes[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(out)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return _str(str(value))


def _str(value: str) -> str:
    # A TOML basic string accepts JSON's escapes for everything these values hold.
    return json.dumps(value)
