"""Derived VF MACs: one config gives every VF of every node its own MAC.

The formula (documented in rdmad.toml(5) and docs/CONFIG-REFERENCE.md; changing it
changes every derived MAC in a fleet, so it never changes):

* ``derive = "pf-mac"``: the text ``rdmad-vf-mac pf-mac=<PF's permanent MAC> vf=<index>``;
* ``derive = "machine-id"``: the text
  ``rdmad-vf-mac machine-id=<machine-id> pf=<PF's PCI address> vf=<index>``;

each MAC lowercase with colons, the index in decimal. The MAC is the first 6 bytes of
the text's SHA-256, with the first byte's two low bits set to ``10``: unicast and
locally administered (IEEE 802: never a vendor's address, never multicast).

Both inputs outlive a reboot and a re-install: the permanent MAC is burnt into the card
(a MAC follows the card to another slot or host), the machine-id is the installation's
(systemd-networkd's ``MACAddressPolicy=persistent`` uses it the same way; a MAC stays
with the node and slot). Pure: no I/O.
"""

from __future__ import annotations

PF_MAC = "pf-mac"
MACHINE_ID = "machine-id"


def derive_mac(
    how: str,
    *,
    vf: int,
    pf_mac: str | None = None,
    machine_id: str | None = None,
    pf: str | None = None,
) -> str:
    """The derived MAC of VF ``vf``; ValueError when an input it needs is missing."""
    if how == PF_MAC:
        if pf_mac is None:
            raise ValueError("needs the PF's permanent MAC")
        text = f"rdmad-vf-mac pf-mac={pf_mac.lower()} vf={vf}"
    elif how == MACHINE_ID:
        if machine_id is None or pf is None:
            raise ValueError("needs /etc/machine-id")
        text = f"rdmad-vf-mac machine-id={machine_id} pf={pf} vf={vf}"
    else:
        raise ValueError(f"unknown derivation {how!r}")
    import hashlib  # here: only a derived MAC needs it, and the daemon's start-up does not

    raw = bytearray(hashlib.sha256(text.encode()).digest()[:6])
    raw[0] = (raw[0] & 0xFC) | 0x02  # unicast, locally administered
    return ":".join(f"{b:02x}" for b in raw)


def usable_perm_mac(mac: str | None) -> str | None:
    """A PF's permanent MAC as a derivation input: None when the driver reports none
    (all zeros, as netdevsim and some virtual NICs do)."""
    if mac is None or mac.strip(":0") == "":
        return None
    return mac.lower()
