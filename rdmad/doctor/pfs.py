"""The declared PFs as the doctor finds them: a ``pf = {...}`` reference resolved to a
device (a PCI address, or a netdevsim device's name for the lab's test devices), that
device's sysfs directory and its VFs."""

from __future__ import annotations

from typing import Any

from rdmad import pfselect
from rdmad.doctor.fs import Root

PCI_DEVICES = "sys/bus/pci/devices"
NSIM_DEVICES = "sys/bus/netdevsim/devices"


def is_netdevsim(dev: str) -> bool:
    return dev.startswith("netdevsim")


def device_dir(dev: str) -> str:
    return f"{NSIM_DEVICES}/{dev}" if is_netdevsim(dev) else f"{PCI_DEVICES}/{dev}"


def label(ref: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in ref.items())


def own_netdev(fs: Root, names: list[str]) -> str | None:
    """The netdev that stands for a device among those under its net/ (not a
    representor; the daemon's choice, ``rdmad.pfselect.own_netdev``)."""

    def dev_port(name: str) -> int:
        text = fs.read(f"sys/class/net/{name}/dev_port")
        return int(text) if text is not None and text.isdigit() else 0

    return pfselect.own_netdev(
        (n, fs.read(f"sys/class/net/{n}/phys_port_name"), dev_port(n)) for n in names
    )


def resolve_pf(fs: Root, ref: dict[str, Any]) -> str | None:
    """The device a reference names (by PCI address, or through its netdev's name or
    MAC); None when no such device is present."""
    if "pci" in ref:
        pci = str(ref["pci"]).lower()
        return pci if fs.exists(f"{PCI_DEVICES}/{pci}") else None
    for name in fs.listdir("sys/class/net"):
        if "name" in ref and name != ref["name"]:
            continue
        if (
            "mac" in ref
            and (fs.read(f"sys/class/net/{name}/address") or "").lower() != str(ref["mac"]).lower()
        ):
            continue
        dev = fs.link_name(f"sys/class/net/{name}/device")
        if dev is not None:
            return dev
    return None


def vfs(fs: Root, dev: str) -> list[tuple[int, str, str | None]]:
    """(index, PCI address, bound driver) of each of a PF's VFs (its virtfnN links).
    netdevsim's VFs are not devices: their number only, from sriov_numvfs."""
    base = device_dir(dev)
    if is_netdevsim(dev):
        raw = fs.read(f"{base}/sriov_numvfs") or "0"
        return [(i, f"{dev} vf {i}", None) for i in range(int(raw) if raw.isdigit() else 0)]
    out = []
    for name in fs.listdir(base):
        if name.startswith("virtfn") and name[6:].isdigit():
            pci = fs.link_name(f"{base}/{name}")
            if pci is not None:
                out.append((int(name[6:]), pci, fs.link_name(f"{PCI_DEVICES}/{pci}/driver")))
    return sorted(out)
