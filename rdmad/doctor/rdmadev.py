"""The rdma-devices check: the RDMA devices there are and their ports, and, when there
is none, what stands in the way, told apart because each has its own fix:

* no ConnectX PCI function (vendor 0x15b3) at all: nothing for mlx5 to drive, so no
  driver to load or bind (Soft-RoCE is what is left);
* a ConnectX function that no driver took while mlx5_core is in the kernel (built in or
  loaded): the function is not bound, named by its PCI address; loading a driver that
  is there already would change nothing;
* mlx5_core or mlx5_ib not in the kernel: load it, or why it cannot be loaded (module
  loading disabled, not installed for this kernel), in the daemon's words
  (``rdmad.modsupport``: ``modules.builtin`` says what is built in);
* mlx5_ib in the kernel and the function on mlx5_core, yet no device: RoCE turned off
  on the function, or a failed probe (the kernel log says which).

Only ConnectX is looked for: another vendor's RDMA NIC makes its device with its own
driver and is seen once it has.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

from rdmad import modsupport
from rdmad.doctor.fs import Root
from rdmad.doctor.pfs import PCI_DEVICES
from rdmad.doctor.report import Check

MELLANOX = "0x15b3"
CORE, IB = "mlx5_core", "mlx5_ib"
RXE_ADVICE = "declare an rxe link ([[rxe]] in rdmad.toml) for Soft-RoCE"
_IN_KERNEL = {"loaded": "loaded", "builtin": "built in"}


class PciFunctions(NamedTuple):
    """The PCI functions that bear on RDMA, from one pass over /sys/bus/pci/devices."""

    connectx: tuple[str, ...]  # Mellanox/NVIDIA (vendor 0x15b3)
    vfs: tuple[str, ...]  # SR-IOV VFs (a ``physfn`` link), any vendor


# Scans once, when first asked (run_checks shares one between the checks: a node has
# hundreds of PCI functions).
PciScan = Callable[[], PciFunctions]


def scan_pci(fs: Root) -> PciFunctions:
    connectx, vfs = [], []
    for pci in fs.listdir(PCI_DEVICES):
        if (fs.read(f"{PCI_DEVICES}/{pci}/vendor") or "").lower() == MELLANOX:
            connectx.append(pci)
        if fs.exists(f"{PCI_DEVICES}/{pci}/physfn"):
            vfs.append(pci)
    return PciFunctions(tuple(connectx), tuple(vfs))


def hardware_devices(fs: Root) -> list[str]:
    """RDMA devices made by a driver for a device (not rxe, which has a ``parent``)."""
    return [
        dev
        for dev in fs.listdir("sys/class/infiniband")
        if not fs.exists(f"sys/class/infiniband/{dev}/parent")
    ]


def rdma_devices(fs: Root, release: str | None, pci: PciScan | None = None) -> Check:
    devices = fs.listdir("sys/class/infiniband")
    if not devices:
        return _none(fs, release, (pci or (lambda: scan_pci(fs)))().connectx)
    evidence: list[str] = []
    layers: Counter[str] = Counter()
    for dev in devices:
        base = f"sys/class/infiniband/{dev}"
        driver = fs.link_name(f"{base}/device/driver") or (
            "rxe" if fs.exists(f"{base}/parent") else "?"
        )
        ports = []
        for port in fs.listdir(f"{base}/ports"):
            layer = fs.read(f"{base}/ports/{port}/link_layer") or "?"
            state = (fs.read(f"{base}/ports/{port}/state") or "?").split(":")[-1].strip()
            layers[layer] += 1
            ports.append(f"port {port} {layer} {state}")
        evidence.append(f"{dev} ({driver}): " + (", ".join(ports) or "no ports"))
    summary = f"{len(devices)} device(s): " + ", ".join(
        f"{n} {k}" for k, n in sorted(layers.items())
    )
    return Check("rdma-devices", "ok", summary, tuple(evidence))


def _none(fs: Root, release: str | None, functions: tuple[str, ...]) -> Check:
    """No RDMA device: why, from the ConnectX functions and the mlx5 drivers."""
    if not functions:
        return Check(
            "rdma-devices",
            "fail",
            "no RDMA device: no RDMA-capable function present (no ConnectX PCI function found)",
            (
                "/sys/class/infiniband is empty",
                f"no PCI function of vendor {MELLANOX} (Mellanox/NVIDIA ConnectX) in "
                f"/{PCI_DEVICES}: there is nothing for mlx5_core and mlx5_ib to drive",
            ),
            f"{RXE_ADVICE}; an RDMA NIC of another vendor needs that vendor's RDMA driver",
        )
    drivers = {pci: fs.link_name(f"{PCI_DEVICES}/{pci}/driver") for pci in functions}
    unbound = [pci for pci, drv in drivers.items() if drv is None]
    on_core = [pci for pci, drv in drivers.items() if drv == CORE]
    evidence = ["/sys/class/infiniband is empty"]
    overridden = []  # unbound, and driver_override names another driver: no bind works
    for pci, drv in drivers.items():
        if drv is None:
            evidence.append(f"{pci}: Mellanox/NVIDIA function with no driver bound")
        else:
            evidence.append(f"{pci}: Mellanox/NVIDIA function bound to {drv}")
        override = fs.read(f"{PCI_DEVICES}/{pci}/driver_override")
        if override and override != "(null)":
            evidence.append(f"{pci}: driver_override = {override}")
            if drv is None and override != CORE:
                overridden.append(pci)
    level = modsupport.support(fs)
    core = _module(fs, CORE, release, level, evidence)
    ib = _module(fs, IB, release, level, evidence)
    fixes: list[str] = []
    if unbound:
        summary = f"no RDMA device: {_functions(unbound)} not bound to a driver"
        if core.in_kernel:
            summary += f" ({CORE} is {core.words})"
            first = unbound[0]
            clear = (
                f"; first clear the driver_override of {', '.join(overridden)} (echo > "
                f"/{PCI_DEVICES}/ADDRESS/driver_override)"
                if overridden
                else ""
            )
            fixes.append(
                f"bind {', '.join(unbound)} to {CORE}, which is {core.words} (echo {first} > "
                f"/sys/bus/pci/drivers/{CORE}/bind){clear}; when it does not bind, the kernel "
                f"log says why (a failed probe, or a device this {CORE} does not know)"
            )
        else:
            fixes.append(core.fix)
        if not ib.in_kernel:
            fixes.append(ib.fix)
    elif not ib.in_kernel:
        summary = f"no RDMA device: {IB} is not in the kernel ({_functions(on_core)} on {CORE})"
        fixes.append(ib.fix)
    elif on_core:
        summary = f"no RDMA device: {IB} made none for {_functions(on_core)} on {CORE}"
        fixes.append(
            f"{IB} is {ib.words}: RoCE may be off on the function (devlink dev param show "
            f"pci/{on_core[0]} name enable_roce), or its probe failed (the kernel log says why)"
        )
    else:
        others = sorted({d for d in drivers.values() if d})
        summary = f"no RDMA device: the ConnectX function(s) are bound to {', '.join(others)}"
        fixes.append(
            f"functions on {', '.join(others)} make no RDMA device on this host (passed through?); "
            f"bind one to {CORE} for host RDMA"
        )
    return Check("rdma-devices", "fail", summary, tuple(evidence), "; ".join(fixes))


class _Module(NamedTuple):
    """Whether an mlx5 module is in the kernel, in words, and the fix when it is not."""

    in_kernel: bool
    words: str
    fix: str


_DOES = {CORE: "it binds the ConnectX functions", IB: "it makes their RDMA devices"}


def _module(
    fs: Root, name: str, release: str | None, level: modsupport.Support, evidence: list[str]
) -> _Module:
    found, seen = modsupport.availability(fs, name, release, level)
    if found in _IN_KERNEL:
        evidence.append(f"{name}: {_IN_KERNEL[found]}")
        return _Module(True, _IN_KERNEL[found], "")
    evidence.append(f"{name}: not in the kernel ({seen})")
    why = modsupport.cannot_load(name, level, found, seen, release)
    if why is None:  # installed, or not known: modprobe says
        return _Module(False, "not loaded", f"load {name} (modprobe {name}): {_DOES[name]}")
    install = f"install {name} for this kernel (its modules package, or MOFED/DOCA)"
    if level == "none":
        fix = f"run a kernel with {name} built in"
    elif level == "disabled":
        fix = (
            f"{install}, then reboot"
            if found == "missing"
            else f"load {name} before modules_disabled is set (modules-load.d), or reboot"
        )
    else:
        fix = install
    return _Module(False, "not loaded", f"{why}: {fix}")


def _functions(pcis: list[str]) -> str:
    if len(pcis) == 1:
        return f"ConnectX function {pcis[0]}"
    shown = ", ".join(pcis[:3]) + (", ..." if len(pcis) > 3 else "")
    return f"{len(pcis)} ConnectX functions ({shown})"
