"""Value types of the config schema: MACs, GUIDs, PCI addresses, names, durations.

Each is a base type with msgspec constraints (``Meta``) and, where a value is also
normalized, a check run by ``rdmad.model.validation`` (``After``/``Before``)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from msgspec import Meta

from rdmad.model.validation import After
from rdmad.pfselect import pci_id

# --- value types -----------------------------------------------------------------

_MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_GUID_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){7}$")
_PCI_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_IFNAME_RE = re.compile(r"^[^/\s:]{1,15}$")


def unicast_mac(value: str) -> str:
    mac = value.strip().lower()
    if not _MAC_RE.match(mac):
        raise ValueError(f"not a MAC address (want xx:xx:xx:xx:xx:xx): {value!r}")
    if mac == "00:00:00:00:00:00":
        raise ValueError(f"the all-zero MAC cannot be assigned: {value!r}")
    if int(mac[:2], 16) & 1:
        raise ValueError(f"not a unicast MAC (multicast bit set): {value!r}")
    return mac


def _any_mac(value: str) -> str:
    mac = value.strip().lower()
    if not _MAC_RE.match(mac):
        raise ValueError(f"not a MAC address (want xx:xx:xx:xx:xx:xx): {value!r}")
    return mac


def _guid(value: str) -> str:
    guid = value.strip().lower()
    if not _GUID_RE.match(guid):
        raise ValueError(f"not a GUID (want 8 bytes as xx:xx:xx:xx:xx:xx:xx:xx): {value!r}")
    return guid


def _pci(value: str) -> str:
    addr = value.strip().lower()
    if re.match(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", addr):
        addr = "0000:" + addr  # the short form lspci prints
    if not _PCI_RE.match(addr):
        raise ValueError(f"not a PCI address (want DDDD:BB:DD.F): {value!r}")
    return addr


def _ifname(value: str) -> str:
    if not _IFNAME_RE.match(value) or value in (".", ".."):
        raise ValueError(
            f"not a network interface name (1-15 chars, no '/', ':' or space): {value!r}"
        )
    return value


def _pci_id(value: str) -> str:
    """A PCI vendor or device ID as lspci -n and sysfs print it: 4 hex digits."""
    ident = pci_id(value)
    if ident is None:
        raise ValueError(f"not a PCI ID (want 4 hex digits, e.g. '15b3'): {value!r}")
    return ident


def _pattern(value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"not a pattern (no spaces, not empty): {value!r}")
    return value


def one_or_many(value: object) -> object:
    """A selector key: one string or an array of strings (any of them matches)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and not value:
        raise ValueError("an empty array matches nothing; leave the key out instead")
    return value


UnicastMac = Annotated[str, After(unicast_mac)]
PciId = Annotated[str, After(_pci_id)]
# A shell-style pattern (fnmatch: *, ?, [...]), as udev and networkd's [Match] take.
Pattern = Annotated[str, After(_pattern)]
AnyMac = Annotated[str, After(_any_mac)]
Guid = Annotated[str, After(_guid)]
PciAddress = Annotated[str, After(_pci)]
IfName = Annotated[str, After(_ifname)]
RdmaName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]{1,63}$")]
ModuleName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,55}$")]

VlanProto = Literal["802.1Q", "802.1ad"]
LinkState = Literal["auto", "enable", "disable"]
IbPolicy = Literal["Follow", "Up", "Down"]
# What to do when a VF that is in use has drifted from its declared settings:
# "report" (default) says so and leaves it alone, "apply" rewrites it anyway.
# Rewriting MAC/VLAN/trust under a VM resets the VF on several drivers (i40e, ice)
# and fights libvirt, so applying is an explicit opt-in.
InUseDriftPolicy = Literal["report", "apply"]
# VfSpec.driver value meaning "no driver": the VF stays unbound (e.g. for passthrough
# tools that bind it themselves); kept so through driver_override.
NO_DRIVER = "none"

# Seconds as a float, written in config as "150ms", "5m", "2s" or a bare number.
# systemd's spellings (systemd.time(7)) as operators write them in units: "5min",
# "1h 30s", "90sec"; a number alone is seconds.
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)\s*")
_DURATION_UNITS = {
    **dict.fromkeys(("ms", "msec"), 0.001),
    **dict.fromkeys(("", "s", "sec", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}


def _duration_text(text: str) -> float | None:
    """Seconds of '1h 30s', '5min', '150ms'; None when it is not one."""
    text = text.strip()
    total, pos = 0.0, 0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None or m.group(2) not in _DURATION_UNITS:
            return None
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return total if text else None


def parse_duration(value: object) -> float:
    """'150ms' -> 0.15, '1h 30s' -> 3630.0 (systemd's spellings); numbers are seconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (parsed := _duration_text(value)) is not None:
        seconds = parsed
    else:
        raise ValueError(f"not a duration (e.g. '150ms', '5m', '30s'): {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    return seconds
