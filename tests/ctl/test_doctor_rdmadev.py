"""The doctor's rdma-devices check when there is no RDMA device, on fake trees: no
ConnectX at all (nothing to load or bind), a ConnectX function no driver took while
mlx5 is built in (named, to bind), mlx5 modules to load or that cannot be loaded, and
mlx5_ib there without a device."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmad.doctor import Root, run_checks
from rdmad.doctor.report import Check
from tests.support.fakesysfs import RELEASE, FakeSysfs, gpu_node

CX = "0000:3b:00.0"
CX2 = "0000:3b:00.1"
MLX5 = ("mlx5_core", "mlx5_ib")
KO = {
    "mlx5_core": "kernel/drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko",
    "mlx5_ib": "kernel/drivers/infiniband/hw/mlx5/mlx5_ib.ko",
}


def node(root: Path, *, builtin: tuple[str, ...] = (), disabled: bool = False) -> FakeSysfs:
    """A GPU node with the open GPU driver and ib_core loaded, no RDMA device; the mlx5
    modules in ``builtin`` listed in modules.builtin (as the kernel package lists them;
    a built-in module without parameters has no /sys/module entry), the others
    installed (modules.dep)."""
    fs = gpu_node(root, loaded=("nvidia", "ib_core", "ib_uverbs"), nvidia_taint="O")
    base = f"lib/modules/{RELEASE}"
    fs.write(f"{base}/modules.builtin", "\n".join(KO[m] for m in builtin))
    dep = (fs.root / base / "modules.dep").read_text()
    fs.write(f"{base}/modules.dep", dep + "\n".join(f"{KO[m]}:" for m in MLX5 if m not in builtin))
    fs.write("proc/sys/kernel/modules_disabled", "1" if disabled else "0")
    return fs


def connectx(fs: FakeSysfs, pci: str, driver: str | None = None) -> None:
    fs.pci(pci, driver)
    fs.write(f"sys/bus/pci/devices/{pci}/vendor", "0x15b3")


def check(root: Path) -> Check:
    [c] = [c for c in run_checks(Root(str(root)), None).checks if c.id == "rdma-devices"]
    return c


def says_load_or_bind(c: Check) -> bool:
    text = f"{c.summary} {c.suggestion}".lower()
    return any(w in text for w in ("bind", "load ", "modprobe", "mlx5_core + mlx5_ib"))


@pytest.mark.parametrize("disabled", [True, False], ids=["loading-disabled", "loadable"])
def test_no_connectx_at_all_is_said_and_no_driver_is_suggested(
    tmp_path: Path, disabled: bool
) -> None:
    """The report's node: mlx5_core and mlx5_ib built in, no Mellanox PCI function."""
    fs = node(tmp_path, builtin=MLX5, disabled=disabled)
    fs.pci("0000:17:00.0", "nvidia")  # the GPU: vendor 0x10de
    fs.write("sys/bus/pci/devices/0000:17:00.0/vendor", "0x10de")
    c = check(tmp_path)
    assert c.status == "fail"
    assert c.summary == (
        "no RDMA device: no RDMA-capable function present (no ConnectX PCI function found)"
    )
    assert not says_load_or_bind(c), c
    assert "[[rxe]]" in c.suggestion
    assert any("no PCI function of vendor 0x15b3" in e for e in c.evidence)


def test_builtin_drivers_and_an_unbound_function_name_the_function(tmp_path: Path) -> None:
    fs = node(tmp_path, builtin=MLX5, disabled=True)
    connectx(fs, CX)
    connectx(fs, CX2, "mlx5_core")
    c = check(tmp_path)
    assert c.summary == (
        f"no RDMA device: ConnectX function {CX} not bound to a driver (mlx5_core is built in)"
    )
    assert c.suggestion.startswith(f"bind {CX} to mlx5_core, which is built in (echo {CX} > ")
    assert "modprobe" not in c.suggestion and "load" not in c.suggestion
    assert f"{CX}: Mellanox/NVIDIA function with no driver bound" in c.evidence
    assert f"{CX2}: Mellanox/NVIDIA function bound to mlx5_core" in c.evidence
    assert c.evidence[-2:] == ("mlx5_core: built in", "mlx5_ib: built in")


def test_a_driver_override_that_keeps_mlx5_core_away_is_named(tmp_path: Path) -> None:
    fs = node(tmp_path, builtin=MLX5)
    connectx(fs, CX)
    fs.write(f"sys/bus/pci/devices/{CX}/driver_override", "vfio-pci")
    c = check(tmp_path)
    assert f"{CX}: driver_override = vfio-pci" in c.evidence
    assert f"first clear the driver_override of {CX}" in c.suggestion


@pytest.mark.parametrize(
    ("disabled", "fix"),
    [
        (False, "load mlx5_core (modprobe mlx5_core): it binds the ConnectX functions"),
        (
            True,
            "mlx5_core is not loaded and module loading is disabled until reboot "
            "(/proc/sys/kernel/modules_disabled = 1): load mlx5_core before modules_disabled "
            "is set (modules-load.d), or reboot",
        ),
    ],
    ids=["loadable", "loading-disabled"],
)
def test_an_unbound_function_and_mlx5_core_not_in_the_kernel(
    tmp_path: Path, disabled: bool, fix: str
) -> None:
    fs = node(tmp_path, disabled=disabled)
    connectx(fs, CX)
    c = check(tmp_path)
    assert c.summary == f"no RDMA device: ConnectX function {CX} not bound to a driver"
    assert c.suggestion.startswith(fix + "; "), c.suggestion
    assert "mlx5_ib" in c.suggestion.split("; ")[1]


def test_mlx5_core_missing_for_the_kernel(tmp_path: Path) -> None:
    fs = gpu_node(tmp_path, loaded=("nvidia", "ib_core"))
    connectx(fs, CX)
    c = check(tmp_path)
    assert c.suggestion.startswith(
        f"no mlx5_core module for the running kernel {RELEASE} "
        f"(/lib/modules/{RELEASE}/modules.dep has no mlx5_core): install mlx5_core for this "
        "kernel"
    ), c.suggestion


def test_bound_to_mlx5_core_without_mlx5_ib(tmp_path: Path) -> None:
    fs = node(tmp_path, builtin=("mlx5_core",))
    connectx(fs, CX, "mlx5_core")
    c = check(tmp_path)
    assert c.summary == (
        f"no RDMA device: mlx5_ib is not in the kernel (ConnectX function {CX} on mlx5_core)"
    )
    assert c.suggestion == "load mlx5_ib (modprobe mlx5_ib): it makes their RDMA devices"


def test_mlx5_ib_there_and_still_no_device(tmp_path: Path) -> None:
    fs = node(tmp_path, builtin=MLX5)
    connectx(fs, CX, "mlx5_core")
    connectx(fs, CX2, "mlx5_core")
    c = check(tmp_path)
    assert c.summary == (
        f"no RDMA device: mlx5_ib made none for 2 ConnectX functions ({CX}, {CX2}) on mlx5_core"
    )
    assert f"devlink dev param show pci/{CX} name enable_roce" in c.suggestion


def test_functions_passed_through(tmp_path: Path) -> None:
    fs = node(tmp_path, builtin=MLX5)
    connectx(fs, CX, "vfio-pci")
    c = check(tmp_path)
    assert c.summary == "no RDMA device: the ConnectX function(s) are bound to vfio-pci"
