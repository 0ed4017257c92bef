"""The node's live SR-IOV and rxe state, written in rdmad's config format.

"Make what I set by hand persistent" is then one command: `rdmad snapshot >
/etc/rdmad/rdmad.d/50-snapshot.toml`. The output is a declaration that plans
nothing on the node it came from (tested as a round trip).

Written by hand rather than with a TOML library: the values are MACs, GUIDs,
names, integers and booleans, and the file is meant to be read by people, so
it carries a header and keeps the key order of the example config.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from rdmad.model import Observed, PfObserved, VfObserved, VfSettings

_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
ZERO_MAC = "00:00:00:00:00:00"
ZERO_GUID = "00:00:00:00:00:00:00:00"
# Drivers that mean "chosen by someone": a VF on its default driver needs no key.
EXPLICIT_DRIVERS = frozenset({"vfio-pci", "pci-stub"})
_SETTING_KEYS = (
    "mac", "vlan", "qos", "vlan_proto", "spoofchk", "trust", "link_state",
    "min_tx_rate", "max_tx_rate", "query_rss",
)  # fmt: skip


def snapshot(observed: Observed, header: str = "") -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for pf in observed.pfs:
        if pf.numvfs > 0:
            lines.extend(_sriov(pf))
    for link in observed.rdma_links:
        if link.is_rxe and link.netdev:
            lines += ["", "[[rxe]]", f"name = {_str(link.name)}"]
            lines.append(f"netdev = {{ name = {_str(link.netdev)} }}")
    return "\n".join(lines).lstrip("\n") + "\n"


def _sriov(pf: PfObserved) -> list[str]:
    if _PCI.match(pf.pci) or not pf.netdev:
        lines = ["", "[[sriov]]", f"pf = {{ pci = {_str(pf.pci)} }}"]
    else:  # not a PCI function (netdevsim): its netdev name is what a config can match
        lines = ["", "[[sriov]]", f"pf = {{ name = {_str(pf.netdev)} }}  # {pf.pci}"]
    if pf.netdev and _PCI.match(pf.pci):
        lines[-1] += f"  # {pf.netdev}, driver {pf.driver or 'none'}"
    lines.append(f"numvfs = {pf.numvfs}")
    for vf in pf.vfs:
        body = list(_vf(vf))
        if body:
            lines += ["", "[[sriov.vf]]", f"index = {vf.index}", *body]
    return lines


def _vf(vf: VfObserved) -> Iterable[str]:
    if vf.settings is not None:
        yield from _settings(vf.settings)
    driver = vf.driver_override or vf.driver
    if driver in EXPLICIT_DRIVERS:
        yield f"driver = {_str(driver)}"
    if vf.ib is not None:
        for key in ("node_guid", "port_guid"):
            value = getattr(vf.ib, key)
            if value and value != ZERO_GUID:
                yield f"{key} = {_str(value)}"
        if vf.ib.policy:
            yield f"policy = {_str(vf.ib.policy)}"


def _settings(s: VfSettings) -> Iterable[str]:
    for key in _SETTING_KEYS:
        value = getattr(s, key)
        if value is None or (key == "mac" and value == ZERO_MAC):
            continue  # unreported, or the "no MAC assigned" marker
        if key in ("qos", "vlan_proto") and not s.vlan:
            continue  # meaningless without a VLAN; the config requires vlan with them
        yield f"{key} = {_value(value)}"


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return _str(str(value))


def _str(value: str) -> str:
    # A TOML basic string accepts JSON's escapes for everything these values hold.
    return json.dumps(value)
